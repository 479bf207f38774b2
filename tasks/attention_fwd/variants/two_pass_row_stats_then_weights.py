"""Attention forward (no mask) as two pallas_calls: row statistics first, then normalised weights.

Pass 1 (stats), grid (batch, heads, q blocks, kv blocks), kv axis "arbitrary": each step forms
the [block_q, block_k] logits tile and folds it into the row max m and the row sum
l = sum exp(s - m), which are accumulated DIRECTLY in the two float32 output blocks
([block_q, 1] of m and of l, resident across the kv axis; l is rescaled by exp(m_old - m_new)
when the max grows). No value matrix is touched in this pass.

Pass 2 (weights @ v), grid (batch, heads, q blocks): the head's whole k and v are resident in
VMEM, and a lax.fori_loop over key chunks recomputes the logits, forms the already-normalised
weights p = exp(s - m) / l from the pass-1 statistics and adds p @ v into an f32 carry; no
running rescale is needed since m and l are final. The logits are computed twice (the price of
not carrying the online-softmax correction), and the small m / l arrays round-trip via HBM.

Ragged sequences: nothing is padded in HBM. k/v blocks overhang the sequence; rows past the
sequence hold stale VMEM, so whenever seq is not a multiple of block_k (static) the key columns
past the sequence get a large negative logit and those value rows are zeroed. Overhanging query
rows produce statistics and outputs that are dropped on write-back.
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


def _logits(q, k, scale, start, seq_len):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale
    if seq_len % k.shape[0]:  # static: the last key block overhangs the sequence
        key_pos = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)
    return s


def _stats_kernel(q_ref, k_ref, m_ref, l_ref, *, scale, seq_len, block_k):
    j = pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    s = _logits(q_ref[...], k_ref[...], scale, j * block_k, seq_len)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    l_ref[...] = (jnp.exp(m_prev - m_new) * l_ref[...]
                  + jnp.sum(jnp.exp(s - m_new), axis=-1, keepdims=True))
    m_ref[...] = m_new


def _weights_kernel(q_ref, k_ref, v_ref, m_ref, l_ref, o_ref, *, scale, seq_len, block_k):
    q = q_ref[...]
    m = m_ref[...]
    inv_l = 1.0 / l_ref[...]
    n_chunks = k_ref.shape[0] // block_k

    def chunk(c, acc):
        start = pl.multiple_of(c * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        s = _logits(q, k, scale, start, seq_len)
        if seq_len % block_k:
            val_pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(val_pos < seq_len, v, jnp.zeros_like(v))
        p = jnp.exp(s - m) * inv_l  # final softmax weights of this chunk
        return acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, n_chunks, chunk, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _attention(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    scale = head_dim ** -0.5
    n_q = pl.cdiv(seq, block_q)
    itemsize = q.dtype.itemsize

    # Pass 1: row max and row sum, accumulated in the output blocks over the kv grid axis.
    q4 = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                      lambda b, h, i, j: (b, h, i, 0))
    k4 = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim),
                      lambda b, h, i, j: (b, h, j, 0))
    st4 = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, 1), lambda b, h, i, j: (b, h, i, 0))
    stat_shape = jax.ShapeDtypeStruct((batch, heads, seq, 1), jnp.float32)
    m, l = pl.pallas_call(
        functools.partial(_stats_kernel, scale=scale, seq_len=seq, block_k=block_k),
        grid=(batch, heads, n_q, pl.cdiv(seq, block_k)),
        in_specs=[q4, k4],
        out_specs=[st4, st4],
        out_shape=[stat_shape, stat_shape],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(4 * (block_q + block_k) * head_dim * itemsize
                                 + 6 * block_q * block_k * 4 + 8 * _MiB)),
    )(q, k)

    # Pass 2: normalised weights times v, the head's k and v resident.
    kv_rows = _round_up(seq, block_k)
    q3 = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim), lambda b, h, i: (b, h, i, 0))
    kv3 = pl.BlockSpec((pl.squeezed, pl.squeezed, kv_rows, head_dim), lambda b, h, i: (b, h, 0, 0))
    st3 = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, 1), lambda b, h, i: (b, h, i, 0))
    vmem = (4 * (block_q + kv_rows) * head_dim * itemsize + block_q * head_dim * 4
            + 6 * block_q * block_k * 4 + 8 * _MiB)
    return pl.pallas_call(
        functools.partial(_weights_kernel, scale=scale, seq_len=seq, block_k=block_k),
        grid=(batch, heads, n_q),
        in_specs=[q3, kv3, kv3, st3, st3],
        out_specs=q3,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(vmem, 64 * _MiB))),
    )(q, k, v, m, l)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of one shape [batch, heads, seq, head_dim], "
                         f"got {q.shape=} {k.shape=} {v.shape=}")
    seq = q.shape[2]
    block_q = min(BLOCK_Q, _round_up(seq, 128))
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _attention(q, k, v, block_q=block_q, block_k=block_k)
