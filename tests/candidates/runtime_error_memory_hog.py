"""matmul-shaped kernel that also allocates a never-used 64 GiB output in HBM: exhausts memory."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def hog_kernel(x_ref, y_ref, o_ref, big_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    out, _ = pl.pallas_call(
        hog_kernel,
        grid=(pl.cdiv(m, 128), pl.cdiv(n, 128)),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, 128), lambda i, j: (0, j))],
        out_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j)), pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=[jax.ShapeDtypeStruct((m, n), x.dtype), jax.ShapeDtypeStruct((1 << 34,), jnp.float32)],
    )(x, y)
    return out
# task: matmul  expect: runtime_error
