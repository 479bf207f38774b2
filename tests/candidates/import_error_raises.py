"""Calls a Pallas API that does not exist while the module is executed."""
from jax.experimental import pallas as pl

BLOCK = pl.BlockSpecification((8, 128))


def kernel(x):
    return x
# expect: import_error on softmax
