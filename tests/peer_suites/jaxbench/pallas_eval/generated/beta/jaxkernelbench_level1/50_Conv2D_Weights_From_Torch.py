"""Level 1 - Task 50 (fixture: a generated answer to a problem our loader cannot build)."""

import jax
from jax.experimental import pallas as pl


class Model:
    def __init__(self, num_classes=1000):
        self.conv1_weight = None

    def forward(self, x):
        return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)
