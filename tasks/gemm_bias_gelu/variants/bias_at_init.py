"""Fused GEMM + bias + GELU (tanh) with the bias folded into the accumulator's initial value.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". Instead of starting the f32 VMEM
accumulator at zero and adding the bias in the epilogue, the first K step initialises it with
the bias row broadcast over the tile, so acc = b + sum_k x_k @ w_k. The last K step then only
applies GELU and casts. (Addition is commutative; in f32 the rounding differs from
"add the bias last" by a few ulps, far inside the tolerance.)

Ragged edges without padded copies of x's rows or w's columns: M and N use `pl.cdiv` grids;
rows / columns of an edge block past the array hold unspecified values that only reach output
elements Pallas never writes back (the bias block is ragged the same way). Only K, the
contracted dim, is zero-padded to whole blocks, since garbage there would reach real outputs.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (a whole-dim block is
    always a legal TPU block shape)."""
    return dim if dim <= preferred else preferred


def _gelu_tanh(y):
    return 0.5 * y * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)))


def gemm_bias_gelu_kernel(x_ref, w_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init_with_bias():
        # [1, bn] bias row broadcast down the [bm, bn] tile.
        acc_ref[...] = jnp.broadcast_to(b_ref[...].astype(jnp.float32), acc_ref.shape)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _activate():
        o_ref[...] = _gelu_tanh(acc_ref[...]).astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered x, w, bias and output blocks, the f32 accumulator, product and GELU
    temporaries, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bk * bn + 8 * bn + bm * bn) * itemsize + 3 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _gemm_bias_gelu(x, w, b, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        gemm_bias_gelu_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),   # bias as a [1, N] row
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, wp, b.reshape(1, n))


def kernel(x, w, b):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or b.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=} {b.shape=}")
    return _gemm_bias_gelu(x, w, b, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           bk=_block(k, BLOCK_K))
