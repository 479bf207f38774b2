"""int8 x int8 matmul, exact int32 VMEM accumulator, ragged K masked in-kernel (no padding).

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". Each step multiplies an int8 x tile
by an int8 w tile on the MXU into int32 and adds it to an int32 VMEM scratch; the last K step
converts to f32, applies the row scales sx[bm, 1] and column scales sw[1, bn] and casts to the
scale dtype.

No operand is padded: every grid dim is `pl.cdiv(dim, block)`. Rows of x / columns of w past
the M / N edges only reach outputs that Pallas never writes back. Along K, the last tile's
out-of-range lanes hold unspecified values that would be summed into real outputs, so on that
step the kernel zeroes x's columns at global index >= K. Masking one operand is enough here:
integers have no NaN or Inf, so whatever sits in the matching rows of w, 0 * w == 0 exactly.
(A float kernel would have to mask both sides.) Full tiles take the unmasked path.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (a whole-dim block is
    always a legal TPU block shape)."""
    return dim if dim <= preferred else preferred


def int8_matmul_kernel(x_ref, sx_ref, w_ref, sw_ref, o_ref, acc_ref, *, k_total, bk):
    kk = pl.program_id(2)
    last = pl.num_programs(2) - 1

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(x):
        acc_ref[...] += jnp.dot(x, w_ref[...], preferred_element_type=jnp.int32)

    if k_total % bk == 0:
        accumulate(x_ref[...])
    else:
        @pl.when(kk < last)
        def _full_tile():
            accumulate(x_ref[...])

        @pl.when(kk == last)
        def _tail_tile():
            x = x_ref[...]
            col = kk * bk + lax.broadcasted_iota(jnp.int32, x.shape, 1)  # global K index
            accumulate(jnp.where(col < k_total, x, jnp.zeros_like(x)))

    @pl.when(kk == last)
    def _dequantise():
        acc = acc_ref[...].astype(jnp.float32)              # [bm, bn]
        sx = sx_ref[...].astype(jnp.float32)                # [bm, 1]
        sw = sw_ref[...].astype(jnp.float32)                # [1, bn]
        o_ref[...] = (acc * sx * sw).astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, out_itemsize):
    """Double-buffered int8 and output blocks, a masked x copy, the int32 accumulator and
    product and the f32 epilogue, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = 3 * bm * bk + 2 * bk * bn + 2 * bm * bn * out_itemsize + 3 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _int8_matmul(x, sx, w, sw, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        functools.partial(int8_matmul_kernel, k_total=k, bk=bk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
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
    )(x, sx.reshape(m, 1), w, sw.reshape(1, n))


def kernel(x, sx, w, sw):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or sx.shape != (m,) or sw.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {sx.shape=} {w.shape=} {sw.shape=}")
    return _int8_matmul(x, sx, w, sw, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                        bk=_block(k, BLOCK_K))
