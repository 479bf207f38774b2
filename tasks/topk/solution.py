"""Top-8 values per row (descending) by k = 8 rounds of "take the row max, knock out its first occurrence".

Sorting does not lower for TPU; k is small, so k max-reductions over a VMEM-resident row
block are cheap. Ties behave like lax.top_k: an equal value is returned again in the next
round, because only the first position holding the max is knocked out.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 64
K = 8


def topk_kernel(x_ref, o_ref, *, k):
    x = x_ref[...].astype(jnp.float32)                          # [rows, d]
    d = x.shape[1]
    pos = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    for i in range(k):                                          # static k
        m = jnp.max(x, axis=1, keepdims=True)                   # [rows, 1]
        first = jnp.min(jnp.where(x == m, pos, d), axis=1, keepdims=True)
        o_ref[:, i:i + 1] = m.astype(o_ref.dtype)
        x = jnp.where(pos == first, -jnp.inf, x)


def kernel(x):
    k = K
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    rows, d = x2.shape
    block = rows if rows < ROWS else ROWS
    out = pl.pallas_call(
        functools.partial(topk_kernel, k=k),
        grid=(pl.cdiv(rows, block),),
        in_specs=[pl.BlockSpec((block, d), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((block, k), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, k), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x2)
    return out.reshape(*shape[:-1], k)
