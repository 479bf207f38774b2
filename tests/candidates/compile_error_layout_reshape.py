"""softmax that takes its exponentials in a head-split layout and moves them back.

`exp` is element-wise, so exponentiating `x.reshape(rows, d/64, 64).transpose(1, 0, 2)
.reshape(rows, d)` and undoing the shuffle gives the right values: interpret mode passes it
and the Pallas -> Mosaic lowering accepts it.
But re-merging transposed 64-wide pieces into 128-wide lanes is a shape cast Mosaic's layout
inference cannot do: only a real TPU compile (tpu-compile) rejects it ("unsupported shape
cast"), as a TPU host would."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 64


def _split_heads(x):  # [rows, d] -> [rows, d], rows and 64-lane pieces interleaved
    rows, d = x.shape
    return x.reshape(rows, d // 64, 64).transpose(1, 0, 2).reshape(rows, d)


def _merge_heads(y):  # the inverse of _split_heads
    rows, d = y.shape
    return y.reshape(d // 64, rows, 64).transpose(1, 0, 2).reshape(rows, d)


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    shifted = x - jnp.max(x, axis=1, keepdims=True)
    e = _merge_heads(jnp.exp(_split_heads(shifted)))
    o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    rows, d = x2.shape
    block = rows if rows < ROWS else ROWS
    out = pl.pallas_call(
        softmax_kernel,
        grid=(pl.cdiv(rows, block),),
        in_specs=[pl.BlockSpec((block, d), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((block, d), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
    )(x2)
    return out.reshape(shape)
