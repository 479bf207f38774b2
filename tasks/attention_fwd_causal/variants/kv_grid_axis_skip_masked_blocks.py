"""Causal flash-attention forward with the key/value axis as a grid reduction axis; blocks above
the diagonal are skipped with pl.when and only diagonal blocks pay for the mask.

Grid (batch, heads, q blocks, kv blocks); the kv axis is "arbitrary" and the online-softmax state
(row max m, row sum l, f32 accumulator acc) persists in VMEM scratch across it: the first kv
step initialises the state, the last one writes o = acc / l. For a (q block i, kv block j) step:
  - every key comes after every query of the block (j * bk > i * bq + bq - 1): nothing runs, and
    the k/v index maps clamp j to the block's last needed kv block, so the pipeline sees an
    unchanged block index and issues no DMA for skipped steps;
  - every key is at or before every query (j * bk + bk - 1 <= i * bq): the unmasked update;
  - otherwise the block straddles the diagonal: the update with an iota mask (key <= query).
The solution instead keeps the whole head resident and bounds an inner fori_loop over chunks.

Ragged sequences: nothing is padded in HBM. Blocks overhang the arrays. Keys past the sequence
come after every real query, so the causal mask hides them; their value rows hold stale VMEM
and are zeroed in the straddling/last block (p = 0 times a stale NaN would still be NaN).
Overhanging query rows produce output rows that are dropped on write-back. Key 0 is visible
to every query, so l > 0 for every real row.
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


def _causal_step(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, scale, seq_len,
                 block_q, block_k):
    i, j = pl.program_id(2), pl.program_id(3)
    q_start, k_start = i * block_q, j * block_k

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def update(masked):
        q = q_ref[...]
        k = k_ref[...]
        v = v_ref[...]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
        if masked:
            query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            key = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(key <= query, s, _MASK_VALUE)
            if seq_len % block_k:  # static: stale value rows past the sequence
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

    below = k_start + block_k - 1 <= q_start          # fully visible block
    needed = k_start <= q_start + block_q - 1          # some key visible to some query
    # A block holding keys past the sequence always straddles the diagonal of the last q block
    # (its last key exceeds every real query), so the masked branch also zeroes stale values.

    @pl.when(below)
    def _full():
        update(masked=False)

    @pl.when(jnp.logical_and(needed, jnp.logical_not(below)))
    def _diag():
        update(masked=True)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _causal_attention(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    grid = (batch, heads, pl.cdiv(seq, block_q), pl.cdiv(seq, block_k))

    def kv_index(b, h, i, j):
        last_needed = (i * block_q + block_q - 1) // block_k
        return (b, h, jnp.minimum(j, last_needed), 0)

    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i, j: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim), kv_index)
    body = functools.partial(_causal_step, scale=head_dim ** -0.5, seq_len=seq,
                             block_q=block_q, block_k=block_k)
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + block_k) * head_dim * itemsize + block_q * head_dim * 4
            + 8 * block_q * block_k * 4 + 8 * _MiB)
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
    return _causal_attention(q, k, v, block_q=block_q, block_k=block_k)
