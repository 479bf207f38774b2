"""int8 x int8 matmul with an exact int32 VMEM accumulator, dequantised once per output tile.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". Each step multiplies an int8 [bm, bk]
tile of x by an int8 [bk, bn] tile of w on the MXU into int32 and adds it to an int32 VMEM
scratch (integer accumulation is exact, so the K order does not matter). At the last K step the
accumulator is converted to f32 and scaled by the row scales sx[bm, 1] and the column scales
sw[1, bn], then cast to the scale dtype.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def int8_matmul_kernel(x_ref, sx_ref, w_ref, sw_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _dequantise():
        acc = acc_ref[...].astype(jnp.float32)              # [bm, bn]
        sx = sx_ref[...].astype(jnp.float32)                # [bm, 1]
        sw = sw_ref[...].astype(jnp.float32)                # [1, bn]
        o_ref[...] = (acc * sx * sw).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _int8_matmul(x, sx, w, sw, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    # Zero padding is exact for the integer product; padded rows/cols get scale 0 and are
    # sliced off anyway.
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    sxp = jnp.pad(sx, (0, mp - m)).reshape(mp, 1)
    swp = jnp.pad(sw, (0, np_ - n)).reshape(1, np_)
    out = pl.pallas_call(
        int8_matmul_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),   # x int8
            pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),     # row scales
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),   # w int8
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),     # column scales
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), sx.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, sxp, wp, swp)
    return out[:m, :n]


def kernel(x, sx, w, sw):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or sx.shape != (m,) or sw.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {sx.shape=} {w.shape=} {sw.shape=}")
    bm = min(512, _round_up(m, 32))    # int8 packs 32 rows per (sublane, lane) tile
    bn = min(512, _round_up(n, 128))
    bk = min(1024, _round_up(k, 128))
    return _int8_matmul(x, sx, w, sw, bm=bm, bn=bn, bk=bk)
