"""Multi-query attention with the key/value axis as a grid reduction axis; every query head of
a batch row is in the q block, so one streamed k/v tile serves all heads in one step.

Grid (batch, q blocks, kv blocks); the kv axis is "arbitrary". The q/o blocks are
[heads, block_q, head_dim] (all query heads, the same block_q positions of each), and the k/v
blocks are [block_k, head_dim] tiles of the single shared head, so each k/v tile is fetched once
per (batch, q block) and used by every head. Inside a step the q block is viewed as one
[heads * block_q, head_dim] matrix (a leading-dims collapse), its logits against the k tile are
one matmul, and the online-softmax state (row max m, row sum l, f32 accumulator acc for all
heads * block_q rows) persists in VMEM scratch across the kv steps: initialised at the first kv
step (pl.when), written as o = acc / l at the last. The solution instead flattens heads into
rows in the wrapper, keeps the whole k/v resident and loops over key chunks in a fori_loop.

Ragged sequences: nothing is padded in HBM; blocks overhang the arrays. Rows of the last k/v
tile past the sequence hold stale VMEM, so (static: only when seq is not a multiple of block_k)
those key columns get a large negative logit and those value rows are zeroed. Overhanging query
positions produce output rows dropped on write-back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
BLOCK_Q = 128   # query positions per head per step (x heads rows in the matmul)
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _mqa_step(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, scale, seq_len, block_k):
    j = pl.program_id(2)
    heads, block_q, head_dim = q_ref.shape

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    q = q_ref[...].reshape(heads * block_q, head_dim)  # all heads against the shared k tile
    k = k_ref[...]
    v = v_ref[...]
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale  # [heads*block_q, block_k]
    if seq_len % block_k:  # static: the last k/v tile overhangs the sequence
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

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        o = acc_sc[...] / l_sc[...]
        o_ref[...] = o.reshape(heads, block_q, head_dim).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _mqa(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    rows = heads * block_q
    q_spec = pl.BlockSpec((pl.squeezed, heads, block_q, head_dim), lambda b, i, j: (b, 0, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim),
                           lambda b, i, j: (b, 0, j, 0))
    itemsize = q.dtype.itemsize
    vmem = (4 * (rows + block_k) * head_dim * itemsize + rows * head_dim * 4
            + 6 * rows * block_k * 4 + 8 * _MiB)
    return pl.pallas_call(
        functools.partial(_mqa_step, scale=head_dim ** -0.5, seq_len=seq, block_k=block_k),
        grid=(batch, pl.cdiv(seq, block_q), pl.cdiv(seq, block_k)),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32),
                        pltpu.VMEM((rows, 1), jnp.float32),
                        pltpu.VMEM((rows, head_dim), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v)


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != (q.shape[0], 1) + q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"expected q [batch, heads, seq, head_dim] and k, v [batch, 1, seq, "
                         f"head_dim], got {q.shape=} {k.shape=} {v.shape=}")
    seq = q.shape[2]
    block_q = min(BLOCK_Q, _round_up(seq, 128))
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _mqa(q, k, v, block_q=block_q, block_k=block_k)
