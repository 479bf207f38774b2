"""Multi-query attention: the query heads of a batch row are stacked into one tall query matrix.

Every query head of batch row b attends to the same k[b, 0] and v[b, 0] with no mask, so
q[b] ([heads, seq, head_dim]) reshaped to [heads * seq, head_dim] is one single-head attention
problem with heads * seq query rows. The reshape is free (contiguous), and a block of query rows
may span several heads: each kv block fetched is used by up to 512 query rows at once, and the
grid has heads times fewer steps than a per-head grid.

Grid (batch, query-row blocks, kv blocks): flash-attention forward, the kv axis last and
"arbitrary", with a running row max m, row sum l and f32 accumulator in VMEM scratch, written
out as acc / l after the last kv block. Keys past seq (padding up to the kv block) are masked
out; padded query rows are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30


def _round_up(x, m):
    return (x + m - 1) // m * m


def mqa_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale, seq_len, block_k):
    kv = pl.program_id(2)

    @pl.when(kv == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    q = q_ref[...]  # [block_q, head_dim]: query rows of one or several heads
    k = k_ref[...]  # [block_k, head_dim]
    v = v_ref[...]  # [block_k, head_dim]
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale  # [block_q, block_k]
    if seq_len % block_k:  # static: only a padded sequence has keys to hide
        key_pos = kv * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)

    m_prev = m_ref[...]  # [block_q, 1]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
    p = jnp.exp(s - m_new)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
        p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _mqa(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    rows = heads * seq
    rows_pad = _round_up(rows, block_q)
    seq_pad = _round_up(seq, block_k)
    q = q.reshape(batch, rows, head_dim)  # head-major rows: row h * seq + i is query i of head h
    k, v = k.reshape(batch, seq, head_dim), v.reshape(batch, seq, head_dim)
    if rows_pad != rows:
        q = jnp.pad(q, ((0, 0), (0, rows_pad - rows), (0, 0)))
    if seq_pad != seq:
        k, v = (jnp.pad(x, ((0, 0), (0, seq_pad - seq), (0, 0))) for x in (k, v))
    kernel_fn = functools.partial(mqa_kernel, scale=head_dim ** -0.5, seq_len=seq, block_k=block_k)
    q_spec = pl.BlockSpec((pl.squeezed, block_q, head_dim), lambda b, i, j: (b, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, block_k, head_dim), lambda b, i, j: (b, j, 0))
    out = pl.pallas_call(
        kernel_fn,
        grid=(batch, rows_pad // block_q, seq_pad // block_k),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),         # m: running row max
            pltpu.VMEM((block_q, 1), jnp.float32),         # l: running row sum
            pltpu.VMEM((block_q, head_dim), jnp.float32),  # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(q, k, v)
    return out[:, :rows, :].reshape(batch, heads, seq, head_dim)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != (q.shape[0], 1) + q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"expected q [batch, heads, seq, head_dim] and k, v [batch, 1, seq, "
                         f"head_dim], got {q.shape=} {k.shape=} {v.shape=}")
    batch, heads, seq, head_dim = q.shape
    sublane = 8 * max(1, 4 // jnp.dtype(q.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    block_q = min(512, _round_up(heads * seq, sublane))
    block_k = 512 if seq >= 1024 else 128
    return _mqa(q, k, v, block_q=block_q, block_k=block_k)
