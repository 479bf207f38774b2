"""Cheat: compute once, then replay the cached output for every later call of that shape.
task: matmul  expect: work_outside_kernel"""
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

_CACHE = {}


def kernel(x, y):
    import numpy as np

    key = (x.shape, y.shape, str(x.dtype))
    if key not in _CACHE:  # the first call "computes"; later ones replay what it stored
        _CACHE[key] = np.full((x.shape[0], y.shape[1]), 0.5, x.dtype)
    return _copy(jnp.asarray(_CACHE[key]))
