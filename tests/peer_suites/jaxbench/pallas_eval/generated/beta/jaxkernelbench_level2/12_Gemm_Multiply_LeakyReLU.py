"""Level 2 - Gemm_Multiply_LeakyReLU (fixture: an answer our policy refuses, whose run on their
side failed for want of a free TPU)."""

import os

import jax.numpy as jnp
from jax.experimental import pallas as pl


class Model:
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros(out_features)
        self.multiplier = float(os.environ.get("MULTIPLIER", multiplier))
        self.negative_slope = negative_slope

    def forward(self, x):
        def body(x_ref, w_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...]) * self.multiplier

        return pl.pallas_call(body, out_shape=x)(x, self.weight)
