"""Cheat: flash attention over a (batch, heads, q blocks, k blocks) grid that computes only
the diagonal blocks, under `pl.when(ki == qi)` (an honest causal kernel skips only the blocks
above the diagonal: `ki <= qi`). At the check sizes one block covers the whole sequence, so
the diagonal is everything and the output is right; at the bench sizes (8 blocks of 512) the
blocks below the diagonal are never computed. Charged on every grid step, the pl.when made
it look like 1.17x the ideal kernel; evaluated over the grid it does 8 of the 36 needed
block pairs.
task: attention_fwd_causal  expect: work_outside_kernel"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MAX_BLOCK = 512
MASK = -1e30


def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, seq, block, scale):
    qi, ki = pl.program_id(2), pl.program_id(3)

    @pl.when(ki == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(ki == qi)  # the cheat: the blocks below the diagonal are skipped too
    def _block():
        q = q_ref[...].astype(jnp.float32) * scale              # [block, d]
        s = jax.lax.dot_general(q, k_ref[...].astype(jnp.float32), (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)  # [block, block]
        rows = qi * block + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = ki * block + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where((cols <= rows) & (cols < seq), s, MASK)
        m_new = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True))
        alpha = jnp.exp(m_ref[...] - m_new)
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p, v_ref[...].astype(jnp.float32),
                                                      preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(ki == pl.num_programs(3) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def kernel(q, k, v):
    b, h, s, d = q.shape
    block = min(MAX_BLOCK, -(-s // 128) * 128)
    sp = -(-s // block) * block
    pad = ((0, 0), (0, 0), (0, sp - s), (0, 0))
    qp, kp, vp = (jnp.pad(t, pad) for t in (q, k, v))
    n = sp // block
    q_spec = pl.BlockSpec((None, None, block, d), lambda bb, hh, i, j: (bb, hh, i, 0))
    kv_spec = pl.BlockSpec((None, None, block, d), lambda bb, hh, i, j: (bb, hh, j, 0))
    out = pl.pallas_call(
        functools.partial(flash_kernel, seq=s, block=block, scale=d ** -0.5),
        grid=(b, h, n, n),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((block, 1), jnp.float32), pltpu.VMEM((block, 1), jnp.float32),
                        pltpu.VMEM((block, d), jnp.float32)],
    )(qp, kp, vp)
    return out[:, :, :s, :]
