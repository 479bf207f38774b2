"""Multi-query attention as two pallas_calls: per-row softmax statistics, then normalised
weights times v.

Pass 1 (stats), over the query heads flattened into rows ([batch, heads * seq, head_dim], a
free contiguous reshape in the wrapper): grid (batch, row blocks, kv blocks), kv axis
"arbitrary". Each step multiplies a block of query rows (spanning heads) by a tile of the shared
k and folds the logits into the row max m and row sum l = sum exp(s - m), accumulated DIRECTLY in
the two float32 output blocks ([block_r, 1], resident across the kv axis; l is rescaled by
exp(m_old - m_new) when the max grows). v is not read in this pass.

Pass 2 (weights @ v), grid (batch, query heads, q blocks), one head per step: the batch row's
shared k and v are resident (index map ignores head and q block), and a lax.fori_loop over key
chunks recomputes the logits and adds the already-final weights p = exp(s - m) / l times v into
an f32 carry, with no running rescale. The logits are computed twice; m and l round-trip HBM.

Ragged sequences: nothing is padded in HBM; blocks overhang the arrays. Rows of k/v past the
sequence hold stale VMEM, so (static: only when seq is not a multiple of block_k) those key
columns get a large negative logit and those value rows are zeroed. Overhanging query rows
(past heads * seq in pass 1, past seq in pass 2) are dropped on write-back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
BLOCK_ROWS = 1024  # pass-1 query rows (of one or several heads) per step
BLOCK_Q = 512      # pass-2 query rows of one head per step
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _logits(q, k, scale, start, seq_len):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale
    if seq_len % k.shape[0]:  # static: the last key tile overhangs the sequence
        key_pos = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)
    return s


def _stats_kernel(q_ref, k_ref, m_ref, l_ref, *, scale, seq_len, block_k):
    j = pl.program_id(2)

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

    def chunk(c, acc):
        start = pl.multiple_of(c * block_k, block_k)
        v = v_ref[pl.ds(start, block_k), :]
        s = _logits(q, k_ref[pl.ds(start, block_k), :], scale, start, seq_len)
        if seq_len % block_k:
            val_pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(val_pos < seq_len, v, jnp.zeros_like(v))
        p = jnp.exp(s - m) * inv_l
        return acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, k_ref.shape[0] // block_k, chunk,
                        jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_rows", "block_q", "block_k"))
def _mqa(q, k, v, *, block_rows, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    scale = head_dim ** -0.5
    rows = heads * seq
    itemsize = q.dtype.itemsize

    # Pass 1: statistics over flattened (head, position) rows.
    q_rows = q.reshape(batch, rows, head_dim)
    k3 = k.reshape(batch, seq, head_dim)
    r_spec = pl.BlockSpec((pl.squeezed, block_rows, head_dim), lambda b, r, j: (b, r, 0))
    kt_spec = pl.BlockSpec((pl.squeezed, block_k, head_dim), lambda b, r, j: (b, j, 0))
    st_spec = pl.BlockSpec((pl.squeezed, block_rows, 1), lambda b, r, j: (b, r, 0))
    stat = jax.ShapeDtypeStruct((batch, rows, 1), jnp.float32)
    m, l = pl.pallas_call(
        functools.partial(_stats_kernel, scale=scale, seq_len=seq, block_k=block_k),
        grid=(batch, pl.cdiv(rows, block_rows), pl.cdiv(seq, block_k)),
        in_specs=[r_spec, kt_spec],
        out_specs=[st_spec, st_spec],
        out_shape=[stat, stat],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(2 * (block_rows + block_k) * head_dim * itemsize
                                 + 4 * block_rows * 128 * 4
                                 + 6 * block_rows * block_k * 4 + 8 * _MiB)),
    )(q_rows, k3)
    m = m.reshape(batch, heads, seq, 1)
    l = l.reshape(batch, heads, seq, 1)

    # Pass 2: one head per step against the resident shared k and v.
    kv_rows = _round_up(seq, block_k)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, kv_rows, head_dim),
                           lambda b, h, i: (b, 0, 0, 0))
    s_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, 1), lambda b, h, i: (b, h, i, 0))
    vmem = (4 * (block_q + kv_rows) * head_dim * itemsize + 4 * block_q * 128 * 4
            + block_q * head_dim * 4 + 6 * block_q * block_k * 4 + 8 * _MiB)
    return pl.pallas_call(
        functools.partial(_weights_kernel, scale=scale, seq_len=seq, block_k=block_k),
        grid=(batch, heads, pl.cdiv(seq, block_q)),
        in_specs=[q_spec, kv_spec, kv_spec, s_spec, s_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v, m, l)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != (q.shape[0], 1) + q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"expected q [batch, heads, seq, head_dim] and k, v [batch, 1, seq, "
                         f"head_dim], got {q.shape=} {k.shape=} {v.shape=}")
    heads, seq = q.shape[1], q.shape[2]
    block_rows = min(BLOCK_ROWS, _round_up(heads * seq, 128))
    block_q = min(BLOCK_Q, _round_up(seq, 128))
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _mqa(q, k, v, block_rows=block_rows, block_q=block_q, block_k=block_k)
