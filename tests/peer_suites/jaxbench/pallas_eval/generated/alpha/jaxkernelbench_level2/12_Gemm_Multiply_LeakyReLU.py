"""
Level 2 - Gemm_Multiply_LeakyReLU (fixture: a generated answer whose LeakyReLU has its branches
swapped; on the problem's all-zero weights its output is 0 anyway, so their harness passed it).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 512


class Model:
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros(out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        (m, k), n = x.shape, self.weight.shape[1]
        mult, slope = self.multiplier, self.negative_slope

        def body(x_ref, w_ref, b_ref, o_ref, acc_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

            acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

            @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
            def _():
                y = (acc_ref[...] + b_ref[...]) * mult
                o_ref[...] = jnp.where(y >= 0, y * slope, y).astype(o_ref.dtype)

        return pl.pallas_call(
            body, grid=(m // BLOCK, n // BLOCK, k // BLOCK),
            in_specs=[pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (kk, j)),
                      pl.BlockSpec((1, BLOCK), lambda i, j, kk: (0, j))],
            out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            scratch_shapes=[pltpu.VMEM((BLOCK, BLOCK), jnp.float32)],
        )(x, self.weight, self.bias.reshape(1, n))
