"""Weight-only int8 matmul with no padded copies: the ragged K tail is masked in-kernel.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary"; every extent is
`pl.cdiv(dim, block)`. Each step converts the int8 weight tile to x.dtype (exact) and
accumulates x_tile @ w_tile in f32; the per-column scale is applied to the finished sum on
the last K step. For float32 output the output block (resident across K) is the accumulator
and is scaled in place; for bfloat16 output an f32 VMEM scratch accumulates.

Edges: rows / columns past M / N only reach outputs never written back. Past K, the last x
tile's lanes hold unspecified floats (possibly NaN / Inf) and the last weight tile's rows hold
unspecified int8 values. Masking x alone is enough: those lanes are set to 0 and the weights,
being converted integers, are always finite, so 0 * w == 0 exactly. The mask is built only
on the last K step and only when K is not a multiple of the K block (a static check).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims;
# BLOCK_K is a multiple of 32 (whole int8 sublane tiles).
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def dequant_masked_kernel(x_ref, wq_ref, s_ref, o_ref, *scratch, k_total, bk):
    acc_ref = scratch[0] if scratch else o_ref   # f32 output: accumulate in place
    kk = pl.program_id(2)
    last = pl.num_programs(2) - 1

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(x):
        w = wq_ref[...].astype(jnp.float32).astype(x.dtype)   # [bk, bn], exact, finite
        acc_ref[...] += jnp.dot(x, w, preferred_element_type=jnp.float32)

    if k_total % bk == 0:
        accumulate(x_ref[...])
    else:
        @pl.when(kk < last)
        def _full():
            accumulate(x_ref[...])

        @pl.when(kk == last)
        def _tail():
            x = x_ref[...]
            col = kk * bk + lax.broadcasted_iota(jnp.int32, x.shape, 1)   # global K index
            accumulate(jnp.where(col < k_total, x, jnp.zeros_like(x)))

    @pl.when(kk == last)
    def _scale():
        o_ref[...] = (acc_ref[...] * s_ref[...]).astype(o_ref.dtype)   # [bm, bn] * [1, bn]


def _vmem_limit(bm, bn, bk, itemsize, separate_acc):
    """Double-buffered x, int8 wq, scale and output blocks, a masked x copy, the converted
    weight tile, the f32 product (and accumulator), plus headroom; 32..100 MiB."""
    need = (3 * bm * bk * itemsize + 2 * (bk * bn + 8 * bn * 4 + bm * bn * itemsize)
            + bk * bn * (4 + itemsize) + bm * bn * 4 + (bm * bn * 4 if separate_acc else 0))
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _dequant_matmul(x, wq, scales, *, bm, bn, bk):
    m, k = x.shape
    n = wq.shape[1]
    separate_acc = x.dtype != jnp.float32
    return pl.pallas_call(
        functools.partial(dequant_masked_kernel, k_total=k, bk=bk),
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
    )(x, wq, scales.astype(jnp.float32).reshape(1, n))


def kernel(x, wq, scales):
    m, k = x.shape
    k2, n = wq.shape
    if k != k2 or scales.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {wq.shape=} {scales.shape=}")
    return _dequant_matmul(x, wq, scales, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           bk=_block(k, BLOCK_K))
