"""softmax(x) @ v as two pallas_calls: exact row statistics first, then normalised p @ v.

1. stats kernel, grid (M tiles "parallel", K tiles "arbitrary"): an online reduction over K
   tiles keeps the running row max m and the running sum l of exp(x - m) (rescaled by
   exp(m_old - m_new) when the max grows) in VMEM scratch; after the last K tile it writes
   m and 1 / l as two [M, 1] float32 arrays.
2. matmul kernel, grid (M tiles, N tiles, K tiles): with the final m and 1/l known up front,
   each K step forms the already-normalised probabilities p = exp(x - m) * (1 / l) and adds
   p @ v_tile to an f32 VMEM accumulator; nothing is ever rescaled, the accumulator is just
   cast and stored after the last K step.
x is read once more than in a fused online kernel; the statistics make one small HBM round trip.

Ragged edges: the wrapper zero-pads M, K and N to the blocks. Padded K columns are masked to
-1e30 in both kernels (exp gives exactly 0, so they add nothing to l and p is 0 there; the
zero rows of the padded v then add nothing either). Padded rows and columns are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30

BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 512
VMEM_LIMIT_BYTES = 48 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _masked_logits(x_ref, kk, k_true, bk):
    s = x_ref[...].astype(jnp.float32)
    if k_true % bk:
        col = kk * bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(col < k_true, s, _MASK_VALUE)
    return s


def stats_kernel(x_ref, m_out, inv_l_out, m_ref, l_ref, *, k_true, bk):
    kk = pl.program_id(1)

    @pl.when(kk == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)

    s = _masked_logits(x_ref, kk, k_true, bk)
    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
    l_ref[...] = (jnp.exp(m_old - m_new) * l_ref[...]
                  + jnp.sum(jnp.exp(s - m_new), axis=-1, keepdims=True))
    m_ref[...] = m_new

    @pl.when(kk == pl.num_programs(1) - 1)
    def _finish():
        m_out[...] = m_ref[...]
        inv_l_out[...] = 1.0 / l_ref[...]


def pv_kernel(m_ref, inv_l_ref, x_ref, v_ref, o_ref, acc_ref, *, k_true, bk):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    s = _masked_logits(x_ref, kk, k_true, bk)
    p = jnp.exp(s - m_ref[...]) * inv_l_ref[...]                        # normalised
    acc_ref[...] += jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                            preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _softmax_matmul(x, v, *, bm, bn, bk):
    m, k = x.shape
    n = v.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    vp = jnp.pad(v, ((0, kp - k), (0, np_ - n)))

    row_stat = pl.BlockSpec((bm, 1), lambda i, kk: (i, 0))
    stat_shape = jax.ShapeDtypeStruct((mp, 1), jnp.float32)
    row_max, inv_l = pl.pallas_call(
        functools.partial(stats_kernel, k_true=k, bk=bk),
        grid=(mp // bm, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, kk: (i, kk))],
        out_specs=[row_stat, row_stat],
        out_shape=[stat_shape, stat_shape],
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32), pltpu.VMEM((bm, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(xp)

    stat_spec = pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0))
    out = pl.pallas_call(
        functools.partial(pv_kernel, k_true=k, bk=bk),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[stat_spec, stat_spec,
                  pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(row_max, inv_l, xp, vp)
    return out[:m, :n]


def kernel(x, v):
    m, k = x.shape
    k2, n = v.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {v.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    return _softmax_matmul(x, v, bm=min(BLOCK_M, _round_up(m, sublane)),
                           bn=min(BLOCK_N, _round_up(n, 128)),
                           bk=min(BLOCK_K, _round_up(k, 128)))
