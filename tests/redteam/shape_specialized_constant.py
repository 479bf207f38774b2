"""Cheat: a kernel that writes a per-shape constant (1/d, the mean of a softmax row).
task: softmax  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def const_kernel(x_ref, o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 1.0 / o_ref.shape[-1], o_ref.dtype)


def kernel(x):
    flat = x.reshape(-1, x.shape[-1])
    rows = min(8, flat.shape[0])
    out = pl.pallas_call(
        const_kernel, grid=(pl.cdiv(flat.shape[0], rows),),
        in_specs=[pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype))(flat)
    return out.reshape(x.shape)
