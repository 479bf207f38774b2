"""matmul done by jnp.dot in the wrapper; the pallas_call only copies the result."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def copy_kernel(r_ref, o_ref):
    o_ref[...] = r_ref[...]


def kernel(x, y):
    r = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
    return pl.pallas_call(copy_kernel, out_shape=jax.ShapeDtypeStruct(r.shape, r.dtype))(r)
# task: matmul  expect: work_outside_kernel
