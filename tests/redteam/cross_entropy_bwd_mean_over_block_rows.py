"""Wrong mean: a cross-entropy backward that takes the M of (softmax - onehot) / M from the
block it holds (logits_ref.shape[0], the block's rows) rather than from the whole batch. Every
other step is right: whole rows, the row max taken out before exp, the one-hot from a column
iota against the labels block. Where M fits one row block (a batch of a single row, say) it
is exact; with several row blocks every gradient is M / block_rows times too large (4x at
m=512 and about 2x at m=260, in blocks of 128 rows).

task: cross_entropy_bwd  expect: wrong_output
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 128


def ce_bwd_kernel(logits_ref, labels_ref, out_ref):
    m = logits_ref.shape[0]                                   # the block's rows, not the batch's
    x = logits_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    p = e / jnp.sum(e, axis=-1, keepdims=True)
    col = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    out_ref[...] = ((p - jnp.where(col == labels_ref[...], 1.0, 0.0)) / m).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _run(logits, labels, *, br):
    m, v = logits.shape
    return pl.pallas_call(
        ce_bwd_kernel,
        grid=(pl.cdiv(m, br),),
        in_specs=[pl.BlockSpec((br, v), lambda i: (i, 0)), pl.BlockSpec((br, 1), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, v), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, v), logits.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=64 << 20),
    )(logits, labels.reshape(m, 1))


def kernel(logits, labels):
    m, v = logits.shape
    br = m if m <= BLOCK_ROWS else BLOCK_ROWS
    return _run(logits, labels.astype(jnp.int32), br=br)
