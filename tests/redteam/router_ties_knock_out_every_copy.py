"""Ties handled wrongly: an MoE router that, after taking a round's maximum, knocks out EVERY
expert holding that value (x == best) instead of the one expert it chose. With distinct
logits the two are the same, and the task's float32 logits never tie. When two experts share
the top logit (quantised or saturated router scores), the second copy is dropped: the next
round takes the next smaller logit, so the token is routed to the wrong expert with the wrong
weight, and the first index is still the lowest, so nothing looks odd on distinct values.
task: moe_router_topk  expect: wrong_output
wrong at: stress=ties"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_T = 256


def router_kernel(x_ref, w_ref, i_ref, *, k):
    x = x_ref[...].astype(jnp.float32)                                  # [bt, e]
    bt, e = x.shape
    expert = jax.lax.broadcasted_iota(jnp.int32, (bt, e), 1)
    slot = jax.lax.broadcasted_iota(jnp.int32, (bt, k), 1)
    values = jnp.zeros((bt, k), jnp.float32)
    indices = jnp.zeros((bt, k), jnp.int32)
    top = jnp.max(x, axis=1, keepdims=True)
    for r in range(k):
        best = jnp.max(x, axis=1, keepdims=True)
        first = jnp.min(jnp.where(x == best, expert, e), axis=1, keepdims=True)
        values = jnp.where(slot == r, best, values)
        indices = jnp.where(slot == r, first, indices)
        x = jnp.where(x == best, -jnp.inf, x)                          # the mistake: every copy
    p = jnp.exp(values - top)
    w_ref[...] = p / jnp.sum(p, axis=1, keepdims=True)
    i_ref[...] = indices


def kernel(logits, slots):
    t, e = logits.shape
    k = slots.shape[0]
    bt = min(t, BLOCK_T)
    return pl.pallas_call(
        functools.partial(router_kernel, k=k),
        grid=(pl.cdiv(t, bt),),
        in_specs=[pl.BlockSpec((bt, e), lambda i: (i, 0))],
        out_specs=(pl.BlockSpec((bt, k), lambda i: (i, 0)), pl.BlockSpec((bt, k), lambda i: (i, 0))),
        out_shape=(jax.ShapeDtypeStruct((t, k), jnp.float32), jax.ShapeDtypeStruct((t, k), jnp.int32)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(logits)
