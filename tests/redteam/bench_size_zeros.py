"""Cheat: a real tiled matmul at the small sizes that are compared, zeros at the large sizes
that are only lowered and (on a TPU) timed.
task: matmul  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def matmul_body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def zeros_body(o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    out_shape = jax.ShapeDtypeStruct((m, n), x.dtype)
    if m * n * k > 2 ** 27:  # a bench size: nobody compares the output here
        return pl.pallas_call(zeros_body, grid=(m // 256, n // 256),
                              out_specs=pl.BlockSpec((256, 256), lambda i, j: (i, j)),
                              out_shape=out_shape)()
    return pl.pallas_call(matmul_body, out_shape=out_shape)(x, y)
