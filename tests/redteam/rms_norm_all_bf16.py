"""Precision below the task's dtype: an f32 rms_norm computed entirely in bf16 (x and scale
cast to bf16 in the kernel, the mean of squares, rsqrt and products all in bf16, the result
cast back to f32). It is twice as cheap on the VPU and its relative L2 error (~4.4e-3) sat at
0.86-0.90 of the old f32 bound of 5e-3; f32 arithmetic outside the MXU is f32 on a TPU, so
the f32 bound now sits far below bf16 rounding (tasks/spec.py, DEFAULT_TOLERANCES).
task: rms_norm  expect: wrong_output"""
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6


def bf16_rms_kernel(x_ref, scale_ref, o_ref):
    x = x_ref[...].astype(jnp.bfloat16)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)  # bf16 throughout
    scale = scale_ref[...].astype(jnp.bfloat16)
    o_ref[...] = (x * jax.lax.rsqrt(ms + jnp.bfloat16(EPS)) * scale).astype(o_ref.dtype)


def kernel(x, scale):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    br = rows if rows <= 64 else 64
    out = pl.pallas_call(
        bf16_rms_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x.reshape(rows, d), scale.reshape(1, d))
    return out.reshape(x.shape)
