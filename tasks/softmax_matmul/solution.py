"""Fused softmax(x, axis=-1) @ v with an online softmax over K tiles.

Grid (M tiles, N tiles, K tiles). For one output tile the kernel walks K: it keeps the running
row max m and row sum l of exp(x - m) in f32 VMEM scratch, rescales the f32 accumulator by
exp(m_old - m_new) whenever the max grows, and adds exp(x - m_new) @ v_tile. After the last K
tile it stores acc / l. The probabilities never reach HBM. Padded K columns (x padded with
zeros) are masked out of the softmax.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) == 0, never NaN


def _round_up(x, m):
    return (x + m - 1) // m * m


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
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, vp)
    return out[:m, :n]


def kernel(x, v):
    m, k = x.shape
    k2, n = v.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {v.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(256, _round_up(m, sublane))
    bn = min(512, _round_up(n, 128))
    bk = min(512, _round_up(k, 128))
    return _softmax_matmul(x, v, bm=bm, bn=bn, bk=bk)
