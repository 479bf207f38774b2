"""Bug that needs two blocks: a row-wise prefix sum over 1024-lane column blocks that never carries
the running total from one column block to the next. Every check case has at most 1024 columns,
so each row is one block there; the bench size has four column blocks, and the coverage case
derived from it (two blocks and a tail) exposes the missing carry.
task: cumsum_rows  expect: wrong_output"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS, COLS = 256, 1024


def scan_block(x_ref, o_ref):
    width = x_ref.shape[1]
    col = pl.program_id(1) * width + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    x = jnp.where(col < o_ref.shape[1] * pl.num_programs(1), x_ref[...].astype(jnp.float32), 0.0)
    before = jax.lax.broadcasted_iota(jnp.int32, (width, width), 0)
    after = jax.lax.broadcasted_iota(jnp.int32, (width, width), 1)
    upper = (before <= after).astype(jnp.float32)
    o_ref[...] = jnp.dot(x, upper, precision=jax.lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x):
    rows, d = x.shape
    dp = -(-d // 128) * 128
    cols = min(COLS, dp)
    dp = -(-dp // cols) * cols
    xp = jnp.pad(x, ((0, 0), (0, dp - d)))
    br = min(ROWS, -(-rows // 8) * 8)
    out = pl.pallas_call(
        scan_block, grid=(pl.cdiv(rows, br), dp // cols),
        in_specs=[pl.BlockSpec((br, cols), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((br, cols), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((rows, dp), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(xp)
    return out[:, :d]
