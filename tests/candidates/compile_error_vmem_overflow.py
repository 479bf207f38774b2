"""matmul with whole-array blocks: fine at small sizes, far over VMEM at 4096x4096."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def mm_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x, y):
    m, n = x.shape[0], y.shape[1]
    return pl.pallas_call(mm_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, y)
# task: matmul  expect: compile_error
