"""Fused softmax(x, axis=-1) @ v with an online softmax over K tiles.

Grid (M tiles, N tiles, K tiles). For one output tile the kernel walks K: it keeps the running
row max m and row sum l of exp(x - m) in f32 VMEM scratch, rescales the f32 accumulator by
exp(m_old - m_new) whenever the max grows, and adds exp(x - m_new) @ v_tile. After the last K
tile it stores acc / l. The probabilities never reach HBM. Padded K columns (x padded with
zeros) are masked out of the softmax.

Block sizes are module-level knobs (python -m evaluator tune searches them). x is re-read once
per N tile and v once per M tile, so a wide N block (all of N at the bench size: x is read
once) and a tall M block keep the traffic near the ideal; a long K block keeps the grid short
(each step costs a fixed overhead). Blocks never exceed the aligned dims, so check-size grids
stay small; vmem_limit_bytes is raised to what the blocks need.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) == 0, never NaN

# Block sizes (python -m evaluator tune searches these).
BLOCK_M = 1024
BLOCK_N = 2048
BLOCK_K = 1024

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred, align):
    """The preferred block, or the whole (aligned) dim if that is smaller."""
    return min(preferred, _round_up(dim, align))


def _vmem_limit(bm, bn, bk, itemsize):
    need = (2 * (bm * bk + bk * bn + bm * bn) * itemsize   # x, v, out blocks (double-buffered)
            + 2 * bm * bn * 4                             # f32 accumulator and its update
            + 3 * bm * bk * 4)                            # f32 logits and probabilities
    return min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))


def softmax_matmul_kernel(x_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, k_true, block_k):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    s = x_ref[...].astype(jnp.float32)                                # [bm, bk]
    if k_true % block_k:  # static: only a padded K has columns to hide
        col = kk * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(col < k_true, s, _MASK_VALUE)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))   # [bm, 1]
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                  preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _softmax_matmul(x, v, *, bm, bn, bk):
    m, k = x.shape
    n = v.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    vp = jnp.pad(v, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        functools.partial(softmax_matmul_kernel, k_true=k, block_k=bk),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[
            pltpu.VMEM((bm, 1), jnp.float32),    # m: running row max
            pltpu.VMEM((bm, 1), jnp.float32),    # l: running row sum
            pltpu.VMEM((bm, bn), jnp.float32),   # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, vp)
    return out[:m, :n]


def kernel(x, v):
    m, k = x.shape
    k2, n = v.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {v.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _softmax_matmul(x, v, bm=_block(m, BLOCK_M, sublane), bn=_block(n, BLOCK_N, 128),
                           bk=_block(k, BLOCK_K, 128))
