"""A real tiled matmul that returns twice the product: all the work, the wrong values."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def doubled_matmul_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = (2.0 * jnp.dot(x_ref[...], y_ref[...],
                                preferred_element_type=jnp.float32)).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        doubled_matmul_kernel,
        grid=(pl.cdiv(m, 128), pl.cdiv(n, 128)),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)
# task: matmul  expect: wrong_output
