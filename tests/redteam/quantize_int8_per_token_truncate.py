"""Wrong rounding: per-token int8 quantisation that converts x / scale to int8 with astype
alone, which truncates toward zero (as a C cast does) instead of rounding to nearest. The scale
is right (max |x| / 127, 1 for an all-zero row), the clip is right and every q is within one of
the reference's, so each element looks plausible; but about half of them are one step off
toward zero, a relative L2 error of 1.8e-2..2.3e-2, six times the bound that rounding ties allow.

task: quantize_int8_per_token  expect: wrong_output
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 256


def quantize_kernel(x_ref, q_ref, scale_ref):
    x = x_ref[...].astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    q = jnp.clip(x / scale, -127.0, 127.0)
    q_ref[...] = q.astype(jnp.int32).astype(jnp.int8)   # float -> int truncates toward zero
    scale_ref[...] = scale


@functools.partial(jax.jit, static_argnames=("br",))
def _run(x, *, br):
    m, d = x.shape
    q, scale = pl.pallas_call(
        quantize_kernel,
        grid=(pl.cdiv(m, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)), pl.BlockSpec((br, 1), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((m, d), jnp.int8), jax.ShapeDtypeStruct((m, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=64 << 20),
    )(x)
    return q, scale.reshape(m)


def kernel(x):
    m, d = x.shape
    return _run(x, br=m if m <= BLOCK_ROWS else BLOCK_ROWS)
