"""Fused GEMM + bias + GELU (tanh) with no padded copies and, for f32, no scratch.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary"; every extent is
`pl.cdiv(dim, block)`, so no operand is padded. For float32 output the output block (its
index ignores K, so it stays resident in VMEM across the K loop) is the accumulator, and the
last K step applies bias + GELU to it in place; for bfloat16 output an f32 VMEM scratch
accumulates and the epilogue writes the cast result.

Edges: rows / columns past M / N (and the bias lanes past N) only reach outputs never
written back. Past K, the last tiles' out-of-range lanes of x and rows of w hold unspecified
data (possibly NaN / Inf) that would reach real outputs, so on that step both are zeroed by
global K index before the dot (0 * NaN = NaN, so one side is not enough). The masked branch
exists only when K is not a multiple of the K block and runs only on the last K step.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def _gelu_tanh(y):
    return 0.5 * y * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)))


def gemm_gelu_kernel(x_ref, w_ref, b_ref, o_ref, *scratch, k_total, bk):
    acc_ref = scratch[0] if scratch else o_ref   # f32 output: accumulate in place
    kk = pl.program_id(2)
    last = pl.num_programs(2) - 1

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(x, w):
        acc_ref[...] += jnp.dot(x, w, preferred_element_type=jnp.float32)

    if k_total % bk == 0:
        accumulate(x_ref[...], w_ref[...])
    else:
        @pl.when(kk < last)
        def _full():
            accumulate(x_ref[...], w_ref[...])

        @pl.when(kk == last)
        def _tail():
            x = x_ref[...]
            w = w_ref[...]
            kx = kk * bk + lax.broadcasted_iota(jnp.int32, x.shape, 1)
            kw = kk * bk + lax.broadcasted_iota(jnp.int32, w.shape, 0)
            accumulate(jnp.where(kx < k_total, x, jnp.zeros_like(x)),
                       jnp.where(kw < k_total, w, jnp.zeros_like(w)))

    @pl.when(kk == last)
    def _epilogue():
        y = acc_ref[...] + b_ref[...].astype(jnp.float32)   # [bm, bn] + [1, bn]
        o_ref[...] = _gelu_tanh(y).astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize, separate_acc):
    """Double-buffered x, w, bias and output blocks, masked copies, the f32 product and
    epilogue temporaries (and accumulator), plus headroom; at least 32, at most 100 MiB."""
    need = (3 * (bm * bk + bk * bn) * itemsize + 2 * (8 * bn + bm * bn) * itemsize
            + 2 * bm * bn * 4 + (bm * bn * 4 if separate_acc else 0))
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _gemm_bias_gelu(x, w, b, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    separate_acc = x.dtype != jnp.float32
    return pl.pallas_call(
        functools.partial(gemm_gelu_kernel, k_total=k, bk=bk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)] if separate_acc else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize, separate_acc)),
    )(x, w, b.reshape(1, n))


def kernel(x, w, b):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or b.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=} {b.shape=}")
    return _gemm_bias_gelu(x, w, b, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           bk=_block(k, BLOCK_K))
