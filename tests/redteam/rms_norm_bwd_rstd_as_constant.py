"""Wrong derivative: an RMS-norm backward that treats r = rsqrt(mean(x^2) + eps) as a constant,
so dx = r * dy * scale, without the term -r * xhat * mean(dy * scale * xhat) that r's own
dependence on x contributes. The kernel is otherwise sound: row blocks, a float32 VMEM
accumulator for dscale carried across a sequential grid axis, the ragged last block masked.
The dropped term is about 1/sqrt(d) of dx on random inputs (relative L2 3-7% on the check
shapes), far outside even the bf16 bound, though each element looks plausible.

task: rms_norm_bwd  expect: wrong_output
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 256


def rms_norm_bwd_kernel(x_ref, scale_ref, dy_ref, dx_ref, dscale_ref, acc_ref, *, rows, block_rows):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...].astype(jnp.float32)
    dy = dy_ref[...].astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    xhat = x * r
    dx_ref[...] = (r * dy * scale_ref[...].astype(jnp.float32)).astype(dx_ref.dtype)

    row = i * block_rows + jax.lax.broadcasted_iota(jnp.int32, xhat.shape, 0)
    acc_ref[...] += jnp.sum(jnp.where(row < rows, dy * xhat, 0.0), axis=0, keepdims=True)

    @pl.when(i == pl.num_programs(0) - 1)
    def _store():
        dscale_ref[...] = acc_ref[...].astype(dscale_ref.dtype)


def kernel(x, scale, dy):
    rows, d = x.shape
    br = rows if rows <= BLOCK_ROWS else BLOCK_ROWS
    row_block = pl.BlockSpec((br, d), lambda i: (i, 0))
    fixed = pl.BlockSpec((1, d), lambda i: (0, 0))
    dx, dscale = pl.pallas_call(
        functools.partial(rms_norm_bwd_kernel, rows=rows, block_rows=br),
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_block, fixed, row_block],
        out_specs=[row_block, fixed],
        out_shape=[jax.ShapeDtypeStruct((rows, d), x.dtype), jax.ShapeDtypeStruct((1, d), scale.dtype)],
        scratch_shapes=[pltpu.VMEM((1, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=64 << 20),
    )(x, scale.reshape(1, d), dy)
    return dx, dscale.reshape(d)
