"""Level 1 - Task 19: ReLU (fixture: a generated answer whose problem is not in the checkout)."""

import jax.numpy as jnp
from jax.experimental import pallas as pl


def _relu(x_ref, o_ref):
    o_ref[...] = jnp.maximum(x_ref[...], 0)


class Model:
    def forward(self, x):
        return pl.pallas_call(_relu, out_shape=x)(x)
