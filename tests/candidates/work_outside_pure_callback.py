"""softmax computed on the host through jax.pure_callback, wrapped around a copy kernel."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def _host_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(x.dtype)


def copy_kernel(r_ref, o_ref):
    o_ref[...] = r_ref[...]


def kernel(x):
    r = jax.pure_callback(_host_softmax, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return pl.pallas_call(copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(r)
# task: softmax  expect: work_outside_kernel
