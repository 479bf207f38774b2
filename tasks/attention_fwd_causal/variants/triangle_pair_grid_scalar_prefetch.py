"""Causal flash-attention forward over a flattened lower-triangle grid: only the (q block, kv
block) pairs that hold a visible key are grid steps, enumerated by scalar-prefetched tables.

Grid (batch, heads, pairs). At trace time the wrapper lists, row by row, every pair (i, j) of
q block i and kv block j with j * block_k <= i * block_q + block_q - 1 (the block holds a key
visible to some query), as three int32 tables passed through scalar prefetch: q_block[p],
kv_block[p] and row_end[p] (1 on the last pair of a q block). The index maps read those tables,
so blocks above the diagonal are never fetched or visited at all, and the grid has about half
the steps of a square (q, kv) grid. Consecutive pairs of one q block keep the same q/o block
index, so the output block stays resident while the online-softmax state (row max m, row sum
l, f32 accumulator acc) accumulates in VMEM scratch: a pair with kv_block == 0 resets it and a
pair with row_end writes o = acc / l. The pairs axis is "arbitrary" (it carries that state).

Every visited block is masked with the causal iota test (key <= query), with no branch between
diagonal and interior blocks: interior blocks pass it everywhere.

Ragged sequences: nothing is padded in HBM; blocks overhang. Keys past the sequence come after
every real query and are hidden by the causal mask; their stale value rows are zeroed (static:
only when seq is not a multiple of block_k). Overhanging query rows are dropped on write-back.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
BLOCK_Q = 512
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _pair_tables(seq, block_q, block_k):
    qs, ks, ends = [], [], []
    for i in range(pl.cdiv(seq, block_q)):
        last = min((i * block_q + block_q - 1) // block_k, pl.cdiv(seq, block_k) - 1)
        for j in range(last + 1):
            qs.append(i)
            ks.append(j)
            ends.append(int(j == last))
    return (np.asarray(qs, np.int32), np.asarray(ks, np.int32), np.asarray(ends, np.int32))


def _pair_step(qt_ref, kt_ref, end_ref, q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *,
               scale, seq_len, block_q, block_k):
    p_idx = pl.program_id(2)
    i, j = qt_ref[p_idx], kt_ref[p_idx]

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    q_start, k_start = i * block_q, j * block_k
    v = v_ref[...]
    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale
    query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
    key = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(key <= query, s, _MASK_VALUE)
    if seq_len % block_k:  # static: the last kv block overhangs the sequence
        val_pos = k_start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
        v = jnp.where(val_pos < seq_len, v, jnp.zeros_like(v))

    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v.dtype), v,
                                                preferred_element_type=jnp.float32)
    m_sc[...] = m_new

    @pl.when(end_ref[p_idx] == 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _causal_attention(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    q_tab, k_tab, end_tab = _pair_tables(seq, block_q, block_k)
    n_pairs = len(q_tab)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, p, qt, kt, et: (b, h, qt[p], 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim),
                           lambda b, h, p, qt, kt, et: (b, h, kt[p], 0))
    body = functools.partial(_pair_step, scale=head_dim ** -0.5, seq_len=seq,
                             block_q=block_q, block_k=block_k)
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + block_k) * head_dim * itemsize + block_q * head_dim * 4
            + 8 * block_q * block_k * 4 + 8 * _MiB)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(batch, heads, n_pairs),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, head_dim), jnp.float32)],
    )
    return pl.pallas_call(
        body,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 64 * _MiB))),
    )(jnp.asarray(q_tab), jnp.asarray(k_tab), jnp.asarray(end_tab), q, k, v)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of one shape [batch, heads, seq, head_dim], "
                         f"got {q.shape=} {k.shape=} {v.shape=}")
    seq = q.shape[2]
    block_q = min(BLOCK_Q, _round_up(seq, 128))
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _causal_attention(q, k, v, block_q=block_q, block_k=block_k)
