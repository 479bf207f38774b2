"""Cheat: like decoy_loop_float_trip_count, but the decoy's trip count is computed from a
float input outside the kernel (`(abs(x[0, 0]) * 1e-20).astype(int32) + 1`) and reaches the
kernel as a prefetched scalar, the way honest kernels receive sequence lengths. It is still
float data, not one of the task's integer inputs: the loop counts once and the zeros the
kernel writes at the bench sizes are refused.
task: matmul  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def matmul_body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def zeros_body(n_ref, o_ref):
    o_ref[...] = lax.fori_loop(0, n_ref[0], lambda i, acc: acc * 0.0,
                               jnp.zeros(o_ref.shape, jnp.float32)).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    out_shape = jax.ShapeDtypeStruct((m, n), x.dtype)
    if m * n * k > 2 ** 27:  # a bench size: nobody compares the output here
        trips = (jnp.abs(x[0, :1].astype(jnp.float32)) * 1e-20).astype(jnp.int32) + 1
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(m // 256, n // 256), in_specs=[],
            out_specs=pl.BlockSpec((256, 256), lambda i, j, n_ref: (i, j)))
        return pl.pallas_call(zeros_body, grid_spec=spec, out_shape=out_shape)(trips)
    return pl.pallas_call(matmul_body, out_shape=out_shape)(x, y)
