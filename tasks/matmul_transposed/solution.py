"""x[M, K] @ w[N, K]^T: both operands tiled along K; the MXU contracts their minor dims directly.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary": an f32 VMEM accumulator collects
x_tile @ w_tile^T over the K tiles and is cast to x.dtype at the last one. w is never
transposed in HBM: each [bn, bk] tile of w is contracted on its last dim inside the kernel.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def matmul_nt_kernel(x_ref, w_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # [bm, bk] x [bn, bk] -> [bm, bn], contracting dim 1 of both (no explicit transpose).
    acc_ref[...] += lax.dot_general(x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_nt(x, w, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[0]
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    # Zero padding is exact: padded K columns add nothing; padded rows/cols are sliced off.
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, np_ - n), (0, kp - k)))
    out = pl.pallas_call(
        matmul_nt_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),  # x tile [bm, bk]
            pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)),  # w tile [bn, bk]
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, wp)
    return out[:m, :n]


def kernel(x, w):
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"contracted dims differ: {x.shape=} {w.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(512, _round_up(m, sublane))
    bn = min(512, _round_up(n, 128))   # lane dim of the output tile
    bk = min(512, _round_up(k, 128))   # lane dim of both input tiles
    return _matmul_nt(x, w, bm=bm, bn=bn, bk=bk)
