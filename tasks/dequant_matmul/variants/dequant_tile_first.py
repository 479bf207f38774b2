"""Weight-only int8 matmul that dequantises each weight tile before the dot.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary", an f32 VMEM accumulator. Each step
turns the int8 [bk, bn] tile of wq into real weights in VMEM, w = wq * scales (f32 multiply by
the [1, bn] column-scale row, then cast to x.dtype, the MXU's input dtype), and accumulates
x_tile @ w in f32. The epilogue is a plain cast: the scales were already applied.

This is the textbook "dequantise, then matmul" order, the alternative to factoring the
per-column scale out of the K sum and applying it once per output tile. It costs one VPU
multiply per weight element per M tile (instead of one per output element), and the weights
enter the MXU rounded to x.dtype rather than as exact small integers; for f32 inputs that is
the same rounding any f32 matmul sees, for bf16 inputs a relative 2^-9 per weight, inside the
task's MXU tolerance. The weights still travel from HBM as int8.

Ragged edges: M and N use `pl.cdiv` grids (garbage rows / columns of edge blocks only reach
outputs that are never written back; the scale block is ragged the same way); K is zero-padded
to whole blocks (zero weights add nothing whatever their scale).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 1024  # a multiple of 32: whole int8 sublane tiles
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (a whole-dim block is
    always a legal TPU block shape)."""
    return dim if dim <= preferred else preferred


def dequant_matmul_kernel(x_ref, wq_ref, scales_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # Dequantise the tile: int8 -> f32 (exact), times the per-column scale, -> MXU dtype.
    w = (wq_ref[...].astype(jnp.float32) * scales_ref[...]).astype(x_ref.dtype)  # [bk, bn]
    acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered x, int8 wq, scale and output blocks, the dequantised tile (f32 and
    x.dtype), the f32 accumulator and product, plus headroom; at least 32 MiB, at most
    100 MiB."""
    need = (2 * (bm * bk * itemsize + bk * bn + 8 * bn * 4 + bm * bn * itemsize)
            + bk * bn * (4 + itemsize) + 2 * bm * bn * 4)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _dequant_matmul(x, wq, scales, *, bm, bn, bk):
    m, k = x.shape
    n = wq.shape[1]
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(wq, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        dequant_matmul_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),   # x tile
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),   # int8 weight tile
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),     # its column scales
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, wp, scales.astype(jnp.float32).reshape(1, n))


def kernel(x, wq, scales):
    m, k = x.shape
    k2, n = wq.shape
    if k != k2 or scales.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {wq.shape=} {scales.shape=}")
    return _dequant_matmul(x, wq, scales, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           bk=_block(k, BLOCK_K))
