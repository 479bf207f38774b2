"""Imports os (e.g. to read files or environment): refused before anything runs."""
import os

import jax.numpy as jnp


def kernel(x):
    return jnp.asarray(float(os.environ.get("X", 0))) + x
# task: softmax  expect: policy_violation
