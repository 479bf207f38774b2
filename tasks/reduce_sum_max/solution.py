"""Row-wise sum and max in one pass over x, tiled in both rows and columns.

Grid (row blocks, column blocks); rows are "parallel", the column axis runs in order and
carries a running f32 sum and a running max per row in VMEM scratch ([br, 1] each). Both
outputs are written once, at the last column block, as [br, 1] blocks of [rows, 1] arrays.
A ragged last column block is masked (0 for the sum, -inf for the max); a ragged last row
block needs nothing, since its out-of-range rows are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MAX_ROWS = 512
_MAX_COLS = 1024


def sum_max_kernel(x_ref, sum_ref, max_ref, acc_sum, acc_max, *, d):
    j = pl.program_id(1)
    bd = x_ref.shape[1]

    @pl.when(j == 0)
    def _init():
        acc_sum[...] = jnp.zeros_like(acc_sum)
        acc_max[...] = jnp.full_like(acc_max, -jnp.inf)

    x = x_ref[...].astype(jnp.float32)                          # [br, bd]
    if d % bd:  # ragged last column block: columns past d hold padding
        col = j * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        valid = col < d
        x_sum = jnp.where(valid, x, 0.0)
        x_max = jnp.where(valid, x, -jnp.inf)
    else:
        x_sum = x_max = x
    acc_sum[...] += jnp.sum(x_sum, axis=1, keepdims=True)
    acc_max[...] = jnp.maximum(acc_max[...], jnp.max(x_max, axis=1, keepdims=True))

    @pl.when(j == pl.num_programs(1) - 1)
    def _store():
        sum_ref[...] = acc_sum[...].astype(sum_ref.dtype)
        max_ref[...] = acc_max[...].astype(max_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _sum_max(x, *, br, bd):
    rows, d = x.shape
    out_spec = pl.BlockSpec((br, 1), lambda i, j: (i, 0))
    sums, maxes = pl.pallas_call(
        functools.partial(sum_max_kernel, d=d),
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, j: (i, j))],
        out_specs=[out_spec, out_spec],
        out_shape=[jax.ShapeDtypeStruct((rows, 1), x.dtype)] * 2,
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32), pltpu.VMEM((br, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(x)
    return sums.reshape(rows), maxes.reshape(rows)


def kernel(x):
    rows, d = x.shape
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    br = rows if rows <= _MAX_ROWS else _MAX_ROWS // sublane * sublane
    bd = d if d <= _MAX_COLS else _MAX_COLS                  # full width or a multiple of 128
    return _sum_max(x, br=br, bd=bd)
