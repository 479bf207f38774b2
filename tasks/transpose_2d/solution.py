"""Tiled 2-D transpose: grid step (i, j) reads input tile (i, j) and writes it, transposed in
VMEM, as output tile (j, i).

Each tile dim is the lane dim of either the input or the output tile, so both are 512 (a
multiple of 128) or the whole dim. Every tile is independent: both grid axes are "parallel".
Ragged edge tiles need no padding: a tile's out-of-range rows/cols land in the out-of-range
cols/rows of the output tile, which are never written back.
"""
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_TILE = 512


def transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T          # [bm, bn] -> [bn, bm], an in-VMEM relayout


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def _transpose(x, *, bm, bn):
    m, n = x.shape
    return pl.pallas_call(
        transpose_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x)


def kernel(x):
    m, n = x.shape
    return _transpose(x, bm=m if m <= _TILE else _TILE, bn=n if n <= _TILE else _TILE)
