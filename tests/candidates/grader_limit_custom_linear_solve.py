"""softmax whose kernel is the `solve` of a lax.custom_linear_solve (matvec: the identity).

A correct kernel the grader cannot run yet: its interpret-mode replay does not rebuild
custom_linear_solve around a pallas_call, so the verdict must say that this is the grader's
own limit (`grader_limit`), not blame the kernel with a lowering or runtime error.
"""
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)            # [br, d]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def _softmax_2d(x):
    rows, d = x.shape
    br = rows if rows <= 256 else 256
    return pl.pallas_call(
        softmax_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
    )(x)


def kernel(x):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    flat = x.reshape(rows, d)
    out = jax.lax.custom_linear_solve(lambda v: v, flat, lambda matvec, b: _softmax_2d(b),
                                      symmetric=True)
    return out.reshape(x.shape)
# task: softmax  expect: grader_limit
