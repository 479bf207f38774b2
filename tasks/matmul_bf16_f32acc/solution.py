"""bf16 x bf16 -> f32 matmul that accumulates straight into the resident f32 output tile.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". The output is float32 and its block
index does not depend on K, so the output tile stays in VMEM across the K loop and serves as
the accumulator: no scratch buffer and no final cast. Each step feeds the MXU the tiles in their
own dtype (bf16 products are exact in f32) and adds the f32 partial product.

Block sizes: x is re-read once per N tile and y once per M tile, and every grid step costs a
fixed overhead, so the blocks are large: 2048 x 2048 output tiles, K in 1024 slices, so
4096^3 takes 16 steps. A dim no larger than its block is one whole-dim block; M and N edges
are ragged blocks (no padded copies), only K is zero-padded when it spans several blocks. The
VMEM limit is raised to fit the blocks.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims, so
# check-size grids stay small.
BLOCK_M = 2048
BLOCK_N = 2048
BLOCK_K = 1024
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


def matmul_f32acc_kernel(x_ref, y_ref, o_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered input blocks and f32 output block, the f32 product, plus headroom; at
    least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bk * bn) * itemsize + 3 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_f32acc(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]
    # Only K is padded (zeros add nothing to the sum); ragged last M and N blocks hold
    # garbage rows/cols past the edge that only reach output elements Pallas never writes.
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        matmul_f32acc_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, yp)


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    return _matmul_f32acc(x, y, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                          bk=_block(k, BLOCK_K))
