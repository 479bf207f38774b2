"""matmul with a (7, 100) block: TPU lowering needs the last two block dims divisible by (8, 128)."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def mm_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        mm_kernel,
        grid=(pl.cdiv(m, 7), pl.cdiv(n, 100)),
        in_specs=[pl.BlockSpec((7, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 100), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((7, 100), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)
# task: matmul  expect: lowering_error
