"""Weight-only int8 matmul: x @ (wq * scales) with the dequantisation inside the kernel.

Grid (M tiles, N tiles, K tiles), K innermost. The int8 weight tile is converted to x.dtype in
VMEM (exact: int8 values are integers below 2^8) and multiplied on the MXU into an f32
accumulator. A per-column scale commutes with the sum over K, so it is applied once in the
epilogue: x @ (wq * s) = (x @ wq) * s. The weights travel from HBM as int8; no dequantised
copy exists.

Block sizes: x is re-read once per N tile and wq once per M tile, and every grid step costs a
fixed overhead, so the blocks are large (1024 x 1024 output tiles, K in 2048 slices: 4096^3
takes 32 steps, x read 4 times, wq 4 times). A dim no larger than its block is one whole-dim
block; M and N edges are ragged blocks (no padded copies), only K is zero-padded when it spans
several blocks. The VMEM limit is raised to fit the blocks.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims,
# so check-size grids stay small.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 2048  # a multiple of 32: whole int8 sublane tiles
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


def dequant_matmul_kernel(x_ref, wq_ref, scales_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = wq_ref[...].astype(jnp.float32).astype(x_ref.dtype)   # [bk, bn], exact
    acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] * scales_ref[...]).astype(o_ref.dtype)   # [bm, bn] * [1, bn]


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered blocks, the f32 accumulator, the converted weight tile and the f32
    product, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * bk * itemsize + bk * bn + bn * 4) + 2 * bm * bn * itemsize
            + 2 * bm * bn * 4 + bk * bn * (4 + itemsize))
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _dequant_matmul(x, wq, scales, *, bm, bn, bk):
    m, k = x.shape
    n = wq.shape[1]
    # Only K is padded (zeros add nothing to the sum); ragged last M and N blocks hold
    # garbage rows/cols past the edge that only reach output elements Pallas never writes.
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(wq, ((0, kp - k), (0, 0)))
    sp = scales.astype(jnp.float32).reshape(1, n)
    out = pl.pallas_call(
        dequant_matmul_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, wp, sp)
    return out


def kernel(x, wq, scales):
    m, k = x.shape
    k2, n = wq.shape
    if k != k2 or scales.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {wq.shape=} {scales.shape=}")
    return _dequant_matmul(x, wq, scales, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           bk=_block(k, BLOCK_K))
