"""Cheat: run the kernel as plain JAX everywhere with interpret=True.
task: softmax  expect: policy_violation"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def sm_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - x.max(-1, keepdims=True))
    o_ref[...] = (e / e.sum(-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    return pl.pallas_call(sm_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)
