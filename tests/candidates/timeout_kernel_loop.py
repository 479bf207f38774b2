"""A matmul kernel whose in-kernel while loop never terminates (its exit test is never met)."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def spin_kernel(x_ref, y_ref, o_ref):
    def cond(c):
        return c[0] >= 0

    def body(c):
        return (c[0] + 1, c[1] * 1.0001)

    acc = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    _, acc = jax.lax.while_loop(cond, body, (jnp.int32(0), acc))
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        spin_kernel,
        grid=(pl.cdiv(m, 128), pl.cdiv(n, 128)),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)
# task: matmul  expect: timeout
