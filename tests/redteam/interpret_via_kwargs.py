"""Cheat: smuggle interpret=True through a **kwargs dict.
task: softmax  expect: policy_violation"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

OPTIONS = {"interpret": True}


def sm_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def kernel(x):
    return pl.pallas_call(sm_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), **{"interpret": True})(x)
