"""
Level 1 - Task 23: Softmax (fixture in KernelBench-JAX's format: Model, module-level sizes,
get_inputs, get_init_inputs).
"""

import jax
import jax.numpy as jnp


class Model:
    """Softmax over the feature axis."""

    def __init__(self):
        pass

    def forward(self, x):
        return jax.nn.softmax(x, axis=1)


batch_size = 4096
dim = 393216


def get_inputs():
    key = jax.random.PRNGKey(0)
    x = jax.random.uniform(key, shape=(batch_size, dim))
    return [x]


def get_init_inputs():
    return []
