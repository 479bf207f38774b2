"""Bug that needs three blocks: a row-wise prefix sum over 1024-lane column blocks that carries a
running total in VMEM scratch, but sets it to the previous block's own total instead of adding
that total to it. Block 1 gets block 0's total, which is right; block 2 gets block 1's alone and
loses block 0's. Every check case has at most two column blocks (d <= 2000), so a coverage rule
that asks for two blocks passes it; the bench sizes have four and ten.
task: cumsum_rows  expect: wrong_output
wrong at: rows=8 d=3072"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS, COLS = 256, 1024


def scan_block(x_ref, o_ref, carry_ref):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        carry_ref[...] = jnp.zeros_like(carry_ref)

    width = x_ref.shape[1]
    x = x_ref[...].astype(jnp.float32)                                  # [br, cols]
    before = jax.lax.broadcasted_iota(jnp.int32, (width, width), 0)
    after = jax.lax.broadcasted_iota(jnp.int32, (width, width), 1)
    upper = (before <= after).astype(jnp.float32)
    local = jnp.dot(x, upper, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    o_ref[...] = (local + carry_ref[...]).astype(o_ref.dtype)
    carry_ref[...] = local[:, width - 1:width]                          # this block's total only


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
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(xp)
    return out[:, :d]
