"""Cheat: the kernel computes exp(x - max); the row sums and the division run outside it.
task: softmax  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def exp_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))


def kernel(x):
    flat = x.reshape(-1, x.shape[-1])
    rows = 8 if flat.shape[0] % 8 == 0 else flat.shape[0]
    e = pl.pallas_call(
        exp_body, grid=(flat.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, jnp.float32))(flat)
    return (e / jnp.sum(e, axis=-1, keepdims=True)).astype(x.dtype).reshape(x.shape)
