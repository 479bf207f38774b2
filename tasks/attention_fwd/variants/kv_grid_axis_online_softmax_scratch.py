"""Flash-attention forward (no mask) with the key/value axis as a grid reduction axis.

Grid (batch, heads, q blocks, kv blocks); the last axis is "arbitrary" and walks the keys in
blocks of BLOCK_K rows while the q block and the output block stay resident. The online-softmax
state (running row max m, row sum l, f32 accumulator acc) lives in VMEM scratch that persists
across the kv steps: the first kv step initialises it (pl.when), every step folds its
[block_q, block_k] logits tile into it, and the last kv step writes o = acc / l. Unlike the
solution (whole head resident, inner fori_loops over tiles and chunks), each grid step handles
exactly one (q tile, kv tile) pair and the pipeline streams k and v block by block.

Ragged sequences: nothing is padded in HBM. Blocks overhang the arrays; the rows of the last k/v
block past the sequence hold stale VMEM, so (statically, only when seq is not a multiple of
block_k) the kernel masks those key columns to a large negative logit and zeroes those value
rows. Overhanging query rows compute garbage that is dropped on write-back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
BLOCK_Q = 512
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _flash_step(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, scale, seq_len, block_k):
    j = pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    q = q_ref[...]
    k = k_ref[...]
    v = v_ref[...]
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale  # [block_q, block_k]
    if seq_len % block_k:  # static: some k/v block overhangs the sequence
        start = j * block_k
        key_pos = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        val_pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)
        v = jnp.where(val_pos < seq_len, v, jnp.zeros_like(v))

    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v.dtype), v,
                                                preferred_element_type=jnp.float32)
    m_sc[...] = m_new

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _attention(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    grid = (batch, heads, pl.cdiv(seq, block_q), pl.cdiv(seq, block_k))
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i, j: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim),
                           lambda b, h, i, j: (b, h, j, 0))
    body = functools.partial(_flash_step, scale=head_dim ** -0.5, seq_len=seq, block_k=block_k)
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + block_k) * head_dim * itemsize + block_q * head_dim * 4
            + 6 * block_q * block_k * 4 + 8 * _MiB)
    return pl.pallas_call(
        body,
        grid=grid,
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, head_dim), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 64 * _MiB))),
    )(q, k, v)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of one shape [batch, heads, seq, head_dim], "
                         f"got {q.shape=} {k.shape=} {v.shape=}")
    seq = q.shape[2]
    block_q = min(BLOCK_Q, _round_up(seq, 128))
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _attention(q, k, v, block_q=block_q, block_k=block_k)
