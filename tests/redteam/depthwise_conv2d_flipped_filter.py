"""Convolution where the task means cross-correlation: a depthwise SAME conv that applies each
filter flipped in both directions, out[y, x] = sum w[i, j] * xpad[y + (k-1) - i, x + (k-1) - j],
the textbook definition of a convolution, where deep learning frameworks (and lax's
conv_general_dilated, the reference) compute sum w[i, j] * xpad[y + i, x + j] and call it a
convolution. Everything else is right: the SAME padding, the row loop, float32 sums, the
edges. A symmetric filter would pass; the drawn filters are not symmetric, so every output is
wrong by about its own size.
task: depthwise_conv2d  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_C = 512


def _round_up(x, m):
    return (x + m - 1) // m * m


def dw_kernel(x_ref, w_ref, o_ref, xs_ref, *, c0):
    height, width, bc = x_ref.shape
    k = w_ref.shape[0]
    ph, pw = (k - 1) // 2, (k - 1) // 2

    xs_ref[...] = jnp.zeros(xs_ref.shape, jnp.float32)
    xs_ref[ph:ph + height, c0:c0 + width, :] = x_ref[...].astype(jnp.float32)
    w = w_ref[...].astype(jnp.float32)

    def out_row(y, carry):
        acc = jnp.zeros((width, bc), jnp.float32)
        for i in range(k):
            for j in range(k):
                # The mistake: tap (i, j) weighted by the filter's opposite corner, as a "true"
                # convolution flips its kernel.
                tap = w[k - 1 - i, k - 1 - j:k - j, :]
                acc = acc + tap * xs_ref[y + i, pl.ds(c0 - pw + j, width), :]
        o_ref[y] = acc.astype(o_ref.dtype)
        return carry

    lax.fori_loop(0, height, out_row, 0)


def kernel(x, w):
    n, height, width, c = x.shape
    k = w.shape[0]
    bc = min(c, BLOCK_C)
    pw = (k - 1) // 2
    c0 = _round_up(pw, 8)
    cols = _round_up(c0 - pw + k - 1 + width, 8)
    return pl.pallas_call(
        functools.partial(dw_kernel, c0=c0),
        grid=(n, pl.cdiv(c, bc)),
        in_specs=[pl.BlockSpec((None, height, width, bc), lambda b, cb: (b, 0, 0, cb)),
                  pl.BlockSpec((k, k, bc), lambda b, cb: (0, 0, cb))],
        out_specs=pl.BlockSpec((None, height, width, bc), lambda b, cb: (b, 0, 0, cb)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((height + k - 1, cols, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=96 << 20),
    )(x, w)
