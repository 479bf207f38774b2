"""Row-wise sum and max with column chunks folded straight into resident f32 output blocks.

Grid: (row blocks "parallel", column chunks "arbitrary"). The kernel's two outputs are float32
[rows, 1] arrays whose [block_rows, 1] blocks keep the same index while the chunk axis walks
the row, so they stay in VMEM and are the accumulators themselves: at the first chunk they
are seeded straight from that chunk's row sum and row max (no 0 / -inf initialisation pass),
later chunks add / take the maximum in place. There is no VMEM scratch and no finalisation
step; the wrapper casts the f32 results to x.dtype (glue).

Ragged edges: a ragged last column chunk holds undefined data past d; those lanes are masked
in-kernel with a column iota (0 for the sum, -inf for the max; every chunk has at least one
real column). A ragged last row block computes on rows that are never written back; few rows
make one full-dim row block.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 256
BLOCK_D = 2048
VMEM_LIMIT_BYTES = 32 << 20


def sum_max_kernel(x_ref, sum_ref, max_ref, *, d, bd):
    k = pl.program_id(1)
    x = x_ref[...].astype(jnp.float32)                      # [br, bd]
    if d % bd:
        valid = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < d
        x_sum, x_max = jnp.where(valid, x, 0.0), jnp.where(valid, x, -jnp.inf)
    else:
        x_sum = x_max = x
    s = jnp.sum(x_sum, axis=1, keepdims=True)
    mx = jnp.max(x_max, axis=1, keepdims=True)

    @pl.when(k == 0)
    def _seed():
        sum_ref[...] = s
        max_ref[...] = mx

    @pl.when(k > 0)
    def _fold():
        sum_ref[...] += s
        max_ref[...] = jnp.maximum(max_ref[...], mx)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _sum_max(x, *, br, bd):
    rows, d = x.shape
    out_spec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))   # resident across k
    sums, maxes = pl.pallas_call(
        functools.partial(sum_max_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, k: (i, k))],
        out_specs=[out_spec, out_spec],
        out_shape=[jax.ShapeDtypeStruct((rows, 1), jnp.float32)] * 2,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return sums.reshape(rows).astype(x.dtype), maxes.reshape(rows).astype(x.dtype)


def kernel(x):
    rows, d = x.shape
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _sum_max(x, br=_block(rows, BLOCK_ROWS, sublane), bd=_block(d, BLOCK_D, 128))
