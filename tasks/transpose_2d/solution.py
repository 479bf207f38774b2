"""Tiled 2-D transpose: grid step (i, j) reads input tile (i, j) and writes it, transposed in
VMEM, as output tile (j, i).

Each tile dim is the lane dim of either the input or the output tile, so both are multiples of
128 or the whole dim. Tiles are large (TILE_M x TILE_N, at most _BLOCK_BYTES in the input
dtype: bf16 1024 x 2048, f32 1024 x 1024) because at bench sizes the fixed cost per grid step
is what small tiles lose (bf16 4096 x 4096: 8 steps); every element is read and written once
whatever the tile. The double-buffered tiles plus the transposed copy need more than the
default scoped VMEM, so the limit is VMEM_LIMIT_BYTES. Every tile is independent: both grid
axes are "parallel". Ragged edge tiles need no padding: a tile's out-of-range rows/cols land
in the out-of-range cols/rows of the output tile, which are never written back.
"""
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TILE_M = 1024
TILE_N = 2048
_BLOCK_BYTES = 4 << 20          # one tile, in the input dtype, at most
VMEM_LIMIT_BYTES = 48 << 20


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
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    m, n = x.shape
    bm = m if m <= TILE_M else TILE_M
    cap = max(128, min(TILE_N, _BLOCK_BYTES // (x.dtype.itemsize * bm)) // 128 * 128)
    return _transpose(x, bm=bm, bn=n if n <= cap else cap)
