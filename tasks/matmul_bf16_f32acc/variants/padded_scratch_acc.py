"""bf16 x bf16 -> f32 matmul on zero-padded operands with a separate f32 VMEM accumulator.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". The accumulator is a VMEM scratch
[bm, bn] f32 buffer: zeroed on the first K step, fed one MXU product per step (the tiles go in
their own dtype; bf16 products are exact in f32, so only the f32 summation order rounds), and
copied to the output block once, on the last K step. The output block is thus write-only and
written exactly once per tile, and the kernel does not depend on the output dtype being f32.

Ragged shapes are handled by padding, not by partial blocks: all three dims are zero-padded
to whole blocks outside the kernel (zeros are exact for a matmul: padded K adds nothing,
padded M rows / N columns only produce outputs that are sliced away), so every block in the
kernel is full and the grid is exact division.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). They are clamped to the dims rounded
# up to the (sublane, lane) tile, so check-size grids stay small.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred, align):
    """The preferred block, or the whole dim rounded up to `align` if that is smaller."""
    return min(preferred, _round_up(dim, align))


def matmul_f32acc_kernel(x_ref, y_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered input and f32 output blocks, the accumulator and the f32 product, plus
    headroom; at least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bk * bn) * itemsize + 4 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_f32acc(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        matmul_f32acc_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(xp, yp)
    return out[:m, :n]


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _matmul_f32acc(x, y, bm=_block(m, BLOCK_M, sublane), bn=_block(n, BLOCK_N, 128),
                          bk=_block(k, BLOCK_K, 128))
