"""int8 x int8 matmul with an exact int32 VMEM accumulator, dequantised once per output tile.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". Each step multiplies an int8 [bm, bk]
tile of x by an int8 [bk, bn] tile of w on the MXU into int32 and adds it to an int32 VMEM
scratch (integer accumulation is exact, so the K order does not matter). At the last K step the
accumulator is converted to f32 and scaled by the row scales sx[bm, 1] and the column scales
sw[1, bn], then cast to the scale dtype.

Block sizes: x is re-read once per N tile and w once per M tile, and every grid step costs a
fixed overhead, so the blocks are large (1024 x 1024 output tiles, K in 2048 slices: 4096^3
takes 32 steps). A dim no larger than its block is one whole-dim block; M and N edges are
ragged blocks (no padded copies), only K is zero-padded when it spans several blocks. The
VMEM limit is raised to fit the blocks.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims, so
# check-size grids stay small. Multiples of 128 (int8 packs 32 rows per tile).
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 2048
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128 (so a 3000
    dim with preferred 2048 is two blocks of 1536, not 2048 + a mostly empty one)."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


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


def _vmem_limit(bm, bn, bk, out_itemsize):
    """Double-buffered int8 and output blocks, the int32 accumulator, the int32 product and
    the f32 epilogue, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bk * bn) + 2 * bm * bn * out_itemsize + 3 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _int8_matmul(x, sx, w, sw, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    # Only K is padded (zeros are exact in the integer product); ragged last M and N blocks
    # hold garbage rows/cols past the edge that only reach output elements Pallas never writes.
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        int8_matmul_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),   # x int8
            pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),     # row scales
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),   # w int8
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),     # column scales
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), sx.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, sx.dtype.itemsize)),
    )(xp, sx.reshape(m, 1), wp, sw.reshape(1, n))


def kernel(x, sx, w, sw):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or sx.shape != (m,) or sw.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {sx.shape=} {w.shape=} {sw.shape=}")
    return _int8_matmul(x, sx, w, sw, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                        bk=_block(k, BLOCK_K))
