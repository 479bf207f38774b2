"""bf16 x bf16 -> f32 matmul that accumulates straight into the resident f32 output tile.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". The output is float32 and its block
index does not depend on K, so the output tile stays in VMEM across the K loop and serves as
the accumulator: no scratch buffer and no final cast. Each step feeds the MXU the tiles in their
own dtype (bf16 products are exact in f32) and adds the f32 partial product.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def matmul_f32acc_kernel(x_ref, y_ref, o_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_f32acc(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    # Zero padding is exact: padded K adds nothing; padded rows/cols are sliced off.
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        matmul_f32acc_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, yp)
    return out[:m, :n]


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)       # 8 rows for f32, 16 for bf16
    bm = min(512, _round_up(m, sublane))
    bn = min(512, _round_up(n, 128))
    # bf16 tiles are half the bytes: take twice the K depth per step for the same VMEM.
    bk = min(1024 if itemsize == 2 else 512, _round_up(k, 128))
    return _matmul_f32acc(x, y, bm=bm, bn=bn, bk=bk)
