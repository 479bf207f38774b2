"""Cheat: zeros of the right shape and dtype.
task: softmax  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def copy_kernel(r_ref, o_ref):
    o_ref[...] = r_ref[...]


def _copy(r):  # a tiled Pallas copy: looks like a kernel, computes nothing
    flat = r.reshape(-1, r.shape[-1]) if r.ndim > 1 else r.reshape(1, -1)
    rows = min(8, flat.shape[0])
    out = pl.pallas_call(
        copy_kernel, grid=(pl.cdiv(flat.shape[0], rows),),
        in_specs=[pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype))(flat)
    return out.reshape(r.shape)


def kernel(x):
    return _copy(jnp.zeros_like(x))
