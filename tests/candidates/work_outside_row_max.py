"""softmax whose row max and exponentials are computed outside; the kernel only normalises."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def norm_kernel(e_ref, o_ref):
    e = e_ref[...]
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    xf = x.astype(jnp.float32)
    e = jnp.exp(xf - jnp.max(xf, axis=-1, keepdims=True))
    out = pl.pallas_call(norm_kernel, out_shape=jax.ShapeDtypeStruct(e.shape, x.dtype))(e)
    return out
# task: softmax  expect: work_outside_kernel
