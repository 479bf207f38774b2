"""A matmul 'kernel' that writes zeros: right shape, uses Pallas, computes nothing. At the bench
sizes its kernels do none of the task's arithmetic, which the structure stage sees statically."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def zero_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        zero_kernel,
        grid=(pl.cdiv(m, 128), pl.cdiv(n, 128)),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)
# task: matmul  expect: work_outside_kernel
