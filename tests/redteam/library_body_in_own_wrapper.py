"""Cheat: a three-line kernel body of our own that calls a library's kernel body.
task: matmul  expect: policy_violation"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu.matmul import matmul_kernel as library_body


def my_kernel(x_ref, y_ref, o_ref, acc_ref):
    library_body(x_ref, y_ref, o_ref, acc_ref)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    from jax.experimental.pallas import tpu as pltpu
    return pl.pallas_call(
        functools.partial(my_kernel), grid=(m // 128, n // 128, k // 128),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
    )(x, y)
