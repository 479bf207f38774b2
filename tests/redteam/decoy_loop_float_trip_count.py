"""Cheat: a real matmul at the sizes that are compared, zeros at the bench sizes, plus a
decoy loop whose trip count is computed from float data inside the kernel
(`(abs(x[0, 0]) * 1e-20).astype(int32) + 1`, always 1). A loop the cost model cannot bound
used to mark the count "undecided" and switch both work rules off for every kernel of the
case; only counts from the task's declared integer inputs may do that, so this one counts
once and the zeros are refused as they are without the decoy.
task: matmul  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def matmul_body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def zeros_body(x_ref, o_ref):
    trips = (jnp.abs(x_ref[0, 0].astype(jnp.float32)) * 1e-20).astype(jnp.int32) + 1
    o_ref[...] = lax.fori_loop(0, trips, lambda i, acc: acc * 0.0,
                               jnp.zeros(o_ref.shape, jnp.float32)).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    out_shape = jax.ShapeDtypeStruct((m, n), x.dtype)
    if m * n * k > 2 ** 27:  # a bench size: nobody compares the output here
        return pl.pallas_call(zeros_body, grid=(m // 256, n // 256),
                              in_specs=[pl.BlockSpec((8, 128), lambda i, j: (0, 0))],
                              out_specs=pl.BlockSpec((256, 256), lambda i, j: (i, j)),
                              out_shape=out_shape)(x)
    return pl.pallas_call(matmul_body, out_shape=out_shape)(x, y)
