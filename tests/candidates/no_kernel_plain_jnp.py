"""softmax in plain jax.numpy: correct, but no Pallas kernel at all."""
import jax


def kernel(x):
    return jax.nn.softmax(x.astype("float32"), axis=-1).astype(x.dtype)
# task: softmax  expect: no_kernel
