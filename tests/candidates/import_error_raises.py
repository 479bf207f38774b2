"""Calls a Pallas API that does not exist while the module is executed."""
from jax.experimental import pallas as pl

BLOCK = pl.BlockSpecification((8, 128))


def kernel(x):
    return x
# task: softmax  expect: import_error
