"""A wrapper that never returns: a Python loop waiting for a condition that never holds."""
import jax
from jax.experimental import pallas as pl


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x, y):
    n = 0
    while n >= 0:
        n += 1
    return pl.pallas_call(copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
# task: matmul  expect: timeout
