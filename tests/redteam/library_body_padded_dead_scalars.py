"""Cheat: our own kernel body calls a library's kernel body (jax's matmul_kernel) and pads
itself with ~60 dead scalar equations (stored into an SMEM scratch nobody reads, so jax keeps
them), so that most of the body's equations are "ours" (83%) while all of its work is the
library's. Provenance weighs the work that reaches the outputs.
task: matmul  expect: policy_violation"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.matmul import matmul_kernel as library_body


def my_kernel(x_ref, y_ref, o_ref, acc_ref, pad_ref):
    step = pl.program_id(0) + pl.program_id(1) * 7 + pl.program_id(2) * 13
    for t in range(20):  # bookkeeping nobody reads: three scalar equations per line
        step = step * 3 + t
        pad_ref[0] = step
    library_body(x_ref, y_ref, o_ref, acc_ref)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        functools.partial(my_kernel), grid=(m // 128, n // 128, k // 128),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32), pltpu.SMEM((1,), jnp.int32)],
    )(x, y)
