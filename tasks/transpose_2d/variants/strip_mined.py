"""Tiled 2-D transpose that relayouts each tile in column strips rather than all at once.

Grid step (i, j) reads input tile (i, j) [bm, bn] and writes output tile (j, i) [bn, bm], as
usual. Inside the kernel, instead of one `x_ref[...].T` over the whole tile (whose transposed
copy is as large as the tile), a `fori_loop` walks the tile's columns in CHUNK-wide strips:
strip c is x[:, c*CHUNK:(c+1)*CHUNK] ([bm, CHUNK]), and its transpose is exactly rows
c*CHUNK:(c+1)*CHUNK of the output tile. The live temporary is one [CHUNK, bm] strip, and the
loads of strip c+1 can overlap the stores of strip c. When bn is not a multiple of CHUNK (a
whole, unaligned N), one static tail strip covers the remaining columns.

Ragged edges need no padding: grids are `pl.cdiv`, and the out-of-range rows / columns of an
edge input tile land in out-of-range columns / rows of the output tile, never written back.
Every tile is independent, so both grid axes are "parallel". Values are only moved, never
computed, so the result is bit-exact.
"""
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tile sizes (python -m evaluator tune searches these): input tiles TILE_M x TILE_N, relaid
# out CHUNK columns at a time. All multiples of 128 (each is a lane dim on one side).
TILE_M = 1024
TILE_N = 1024
CHUNK = 256
VMEM_LIMIT_BYTES = 48 << 20


def transpose_strips_kernel(x_ref, o_ref, *, chunk):
    # x_ref: [bm, bn] -> o_ref: [bn, bm]
    bn = x_ref.shape[1]
    n_full = bn // chunk

    def strip(c, carry):
        start = pl.multiple_of(c * chunk, chunk)
        o_ref[pl.ds(start, chunk), :] = x_ref[:, pl.ds(start, chunk)].T
        return carry

    jax.lax.fori_loop(0, n_full, strip, 0)

    tail = bn - n_full * chunk
    if tail:  # static: only for an unaligned whole-dim tile
        o_ref[n_full * chunk:, :] = x_ref[:, n_full * chunk:].T


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _transpose(x, *, bm, bn, chunk):
    m, n = x.shape
    return pl.pallas_call(
        functools.partial(transpose_strips_kernel, chunk=chunk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    m, n = x.shape
    bm = m if m <= TILE_M else TILE_M   # whole dim, or a multiple of 128
    bn = n if n <= TILE_N else TILE_N
    return _transpose(x, bm=bm, bn=bn, chunk=min(CHUNK, bn))
