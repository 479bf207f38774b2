"""Bug at time-block boundaries: a causal depthwise conv tiled over time in 256-row blocks that
zero-pads the kw - 1 rows before EVERY block, as if each block started the sequence, instead of
reading the last rows of the previous block (the halo). Within a block every tap is right, and
so is the whole first block of each sequence; the first kw - 1 outputs of every later block
miss the taps that reach back across the boundary. With the time axis wrongly marked
"parallel" nothing carries state from one block to the next. A check case of one time block
would pass; the train case of 1024 rows has four blocks, and the rows after each boundary are
wrong by a tap or three (a few percent of the rows, far outside the float32 tolerance).
task: causal_depthwise_conv1d  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_T = 256
BLOCK_C = 512
HALO = 8


def conv_kernel(x_ref, w_ref, b_ref, o_ref, buf_ref, *, taps):
    bt = x_ref.shape[0]
    # The mistake: the causal zero padding written before every block, not only the first.
    buf_ref[0:HALO, :] = jnp.zeros((HALO, buf_ref.shape[1]), jnp.float32)
    buf_ref[HALO:HALO + bt, :] = x_ref[...].astype(jnp.float32)
    w = w_ref[...].astype(jnp.float32)
    y = b_ref[...].astype(jnp.float32)
    for j in range(taps):
        y = y + w[j:j + 1, :] * buf_ref[pl.ds(HALO - (taps - 1) + j, bt), :]
    o_ref[...] = (y * jax.nn.sigmoid(y)).astype(o_ref.dtype)


def kernel(x, w, bias):
    b, length, c = x.shape
    taps = w.shape[0]
    bt = min(length, BLOCK_T)
    bc = min(c, BLOCK_C)
    return pl.pallas_call(
        functools.partial(conv_kernel, taps=taps),
        grid=(b, pl.cdiv(c, bc), pl.cdiv(length, bt)),
        in_specs=[pl.BlockSpec((None, bt, bc), lambda i, j, t: (i, t, j)),
                  pl.BlockSpec((taps, bc), lambda i, j, t: (0, j)),
                  pl.BlockSpec((1, bc), lambda i, j, t: (0, j))],
        out_specs=pl.BlockSpec((None, bt, bc), lambda i, j, t: (i, t, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((HALO + bt, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=64 << 20),
    )(x, w, bias.reshape(1, c))
