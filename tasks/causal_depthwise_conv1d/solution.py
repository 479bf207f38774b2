"""Causal depthwise conv1d + SiLU, tiled over time with the kw - 1 rows of halo carried in VMEM.

Grid (batch, channel blocks, time blocks), time last and "arbitrary": the time blocks of one
(batch, channel block) run in order on one core, so the rows of x just before a block are the
last rows of the previous block, which the kernel keeps. A VMEM scratch `buf` of HALO + bt rows
holds, in float32, the HALO rows before the block (zeros at the first time block: the causal
padding) followed by the block itself; tap j of the filter then reads the static window
buf[HALO - (kw - 1) + j : ... + bt], and the output is

    y = bias + sum_j w[j] * window_j,    out = y * sigmoid(y).

After the block, its last HALO rows move to the front of `buf` for the next block. HALO is
kw - 1 rounded up to the 8-row sublane tile, so that copy and the block's store are aligned.
x is read once and the output written once; no padding in HBM. A length that is not a multiple
of the time block ends in a block that overhangs the array: the rows past the end are garbage,
but a causal output row only reads rows at or before it, and the overhanging output rows are
dropped on write-back. Channels are independent, so a channel block that overhangs the array
computes garbage columns that are dropped the same way.

Block sizes: every grid step costs a fixed overhead, and the kernel is memory-bound, so the
blocks are large (BLOCK_T = 512 rows x up to BLOCK_C = 2048 channels; Mamba2-2.7B's 5376
channels become 3 blocks of 1792): 4 x 3 x 8 = 96 steps at the train bench size.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_T = 512   # tune: 256, 512, 1024  (time rows per block, a multiple of 8)
BLOCK_C = 2048  # tune: 512, 1024, 2048  (channels per block, a multiple of 128)
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


def conv_kernel(x_ref, w_ref, b_ref, o_ref, buf_ref, *, taps, halo):
    bt = x_ref.shape[0]

    @pl.when(pl.program_id(2) == 0)
    def _causal_padding():
        buf_ref[0:halo, :] = jnp.zeros((halo, buf_ref.shape[1]), jnp.float32)

    buf_ref[halo:halo + bt, :] = x_ref[...].astype(jnp.float32)
    w = w_ref[...].astype(jnp.float32)                            # [taps, bc]
    y = b_ref[...].astype(jnp.float32)                            # [1, bc], broadcast below
    for j in range(taps):                                         # static: kw is a shape
        y = y + w[j:j + 1, :] * buf_ref[pl.ds(halo - (taps - 1) + j, bt), :]
    o_ref[...] = (y * jax.nn.sigmoid(y)).astype(o_ref.dtype)
    # This block's last `halo` rows precede the next time block.
    buf_ref[0:halo, :] = buf_ref[pl.ds(bt, halo), :]


@functools.partial(jax.jit, static_argnames=("bt", "bc"))
def _conv(x, w, bias, *, bt, bc):
    b, length, c = x.shape
    taps = w.shape[0]
    halo = _round_up(max(taps - 1, 1), 8)
    itemsize = x.dtype.itemsize
    # x and output blocks double-buffered, the f32 window buffer, and the f32 temporaries
    # (the running sum, a window, the product).
    need = 4 * bt * bc * itemsize + (halo + bt) * bc * 4 + 4 * bt * bc * 4
    return pl.pallas_call(
        functools.partial(conv_kernel, taps=taps, halo=halo),
        grid=(b, pl.cdiv(c, bc), pl.cdiv(length, bt)),
        in_specs=[pl.BlockSpec((None, bt, bc), lambda i, j, t: (i, t, j)),
                  pl.BlockSpec((taps, bc), lambda i, j, t: (0, j)),
                  pl.BlockSpec((1, bc), lambda i, j, t: (0, j))],
        out_specs=pl.BlockSpec((None, bt, bc), lambda i, j, t: (i, t, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((halo + bt, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(x, w, bias.reshape(1, c))


def kernel(x, w, bias):
    _, length, c = x.shape
    if w.shape[1:] != (c,) or bias.shape != (c,):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=} {bias.shape=}")
    bt = min(length, BLOCK_T)
    return _conv(x, w, bias, bt=bt, bc=_block(c, BLOCK_C))
