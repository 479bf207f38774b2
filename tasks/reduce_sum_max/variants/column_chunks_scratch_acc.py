"""Row-wise sum and max with the columns split into chunks on an "arbitrary" grid axis.

Grid: (row blocks "parallel", column chunks "arbitrary"). Each step reduces one
[block_rows, BLOCK_D] tile and folds it into two float32 VMEM scratch accumulators (running
sum, seeded with 0; running max, seeded with -inf so all-negative rows come out right). The
last chunk casts both to x.dtype and writes the [block_rows, 1] output blocks, which stay
resident while the chunk index walks the row. Tiles stay small whatever d is, unlike a kernel
that holds whole rows.

Ragged edges: the last column chunk may run past d; those lanes hold undefined data, so they are
masked in-kernel (0 for the sum, -inf for the max) with a column iota. A ragged last row block
computes on rows that are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 512
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def sum_max_kernel(x_ref, sum_ref, max_ref, acc_sum, acc_max, *, d, bd):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_sum[...] = jnp.zeros(acc_sum.shape, jnp.float32)
        acc_max[...] = jnp.full(acc_max.shape, -jnp.inf, jnp.float32)

    x = x_ref[...].astype(jnp.float32)                      # [br, bd]
    if d % bd:
        valid = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < d
        x_sum = jnp.where(valid, x, 0.0)
        x_max = jnp.where(valid, x, -jnp.inf)
    else:
        x_sum = x_max = x
    acc_sum[...] += jnp.sum(x_sum, axis=1, keepdims=True)
    acc_max[...] = jnp.maximum(acc_max[...], jnp.max(x_max, axis=1, keepdims=True))

    @pl.when(k == pl.num_programs(1) - 1)
    def _store():
        sum_ref[...] = acc_sum[...].astype(sum_ref.dtype)
        max_ref[...] = acc_max[...].astype(max_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _sum_max(x, *, br, bd):
    rows, d = x.shape
    out_spec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))
    sums, maxes = pl.pallas_call(
        functools.partial(sum_max_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, k: (i, k))],
        out_specs=[out_spec, out_spec],
        out_shape=[jax.ShapeDtypeStruct((rows, 1), x.dtype)] * 2,
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32), pltpu.VMEM((br, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return sums.reshape(rows), maxes.reshape(rows)


def kernel(x):
    rows, d = x.shape
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _sum_max(x, br=_block(rows, BLOCK_ROWS, sublane), bd=_block(d, BLOCK_D, 128))
