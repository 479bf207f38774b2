"""Values the task's inputs never produce: a row-wise argmax that returns the LAST column holding
the row's maximum (a max over column positions where it should take the min). jnp.argmax returns
the first; the task's own inputs keep every maximum unique, so the two agree on all of them.
Rows of real data (bfloat16 activations, quantised scores) tie often.
task: argmax_rows  expect: wrong_output
wrong at: stress=ties"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 256


def argmax_kernel(x_ref, idx_ref):
    x = x_ref[...].astype(jnp.float32)                                     # [br, d]
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1).astype(jnp.float32)
    row_max = jnp.max(x, axis=1, keepdims=True)
    last = jnp.max(jnp.where(x == row_max, col, -1.0), axis=1, keepdims=True)
    idx_ref[...] = last.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("br",))
def _argmax(x, *, br):
    rows, d = x.shape
    out = pl.pallas_call(
        argmax_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.int32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=64 << 20),
    )(x)
    return out.reshape(rows)


def kernel(x):
    rows = x.shape[0]
    return _argmax(x, br=rows if rows <= BLOCK_ROWS else BLOCK_ROWS)
