"""2-D transpose with the output written in strips while the input tile stays resident.

Grid (M tiles, S) where S counts STRIP-row strips of the output (S = cdiv(N, bc)). Step
(i, s) writes output block (s, i), [bc, bm], which is strip c = s % nc of the transpose of
input tile (i, s // nc), [bm, bn] with bn = nc * bc. The input block index only changes every
nc steps, so Pallas fetches each [bm, bn] input tile once and keeps it in VMEM while the grid
emits its nc output strips; each strip is a smaller write-back DMA that overlaps the next
strip's transpose. (A one-tile-per-step transpose writes the whole [bn, bm] tile at once.)

Edges: every extent is a `pl.cdiv`, so the last input tile / output strip may extend past
the array. A strip starts below N by construction, and the garbage rows / columns of edge
tiles only land in output positions never written back. When N fits in one tile and is not a
multiple of STRIP, the whole (full-dim) tile is one strip. Values are only moved: bit-exact.
"""
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tile sizes (python -m evaluator tune searches these), multiples of 128 (each is a lane dim
# on one side): input tiles TILE_M x (STRIPS * STRIP), written back STRIP output rows at a time.
TILE_M = 1024
STRIP = 256
STRIPS = 4
VMEM_LIMIT_BYTES = 32 << 20


def strip_kernel(x_ref, o_ref, *, nc, bc):
    # x_ref: [bm, bn] resident input tile; o_ref: [bc, bm] one output strip
    if nc == 1:
        o_ref[...] = x_ref[...].T
    else:
        c = pl.program_id(1) % nc
        start = pl.multiple_of(c * bc, bc)
        o_ref[...] = x_ref[:, pl.ds(start, bc)].T


@functools.partial(jax.jit, static_argnames=("bm", "bc", "nc"))
def _transpose(x, *, bm, bc, nc):
    m, n = x.shape
    bn = bc * nc
    return pl.pallas_call(
        functools.partial(strip_kernel, nc=nc, bc=bc),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bc)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, s: (i, s // nc))],
        out_specs=pl.BlockSpec((bc, bm), lambda i, s: (s, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    m, n = x.shape
    bm = m if m <= TILE_M else TILE_M
    if n <= STRIP * STRIPS:
        # One input tile spans all of N; split it into strips only if STRIP divides it.
        bc, nc = (STRIP, n // STRIP) if n % STRIP == 0 else (n, 1)
    else:
        bc, nc = STRIP, STRIPS
    return _transpose(x, bm=bm, bc=bc, nc=nc)
