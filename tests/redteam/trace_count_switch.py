"""Cheat: count its own traces; show the checks a Pallas kernel, then switch to plain XLA
for the later traces that (in an evaluator that traces again) are the ones run and timed.
task: matmul  expect: no_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TRACES = [0]


def matmul_body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x, y):
    TRACES[0] += 1
    if TRACES[0] > 1:  # every trace after the first: no kernel at all
        return (x @ y).astype(x.dtype)
    return pl.pallas_call(matmul_body, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]),
                                                                      x.dtype))(x, y)
