"""1-D convolution over sequence tiles of a VMEM-resident sequence, taps in a fori_loop carry.

Grid: (batch, Cout blocks, L blocks), all "parallel". x's block is the whole (padded) sequence
of one sample with all its channels; its block index depends only on the batch, so it is
fetched once per sample and stays resident while the grid walks the Cout and L blocks. Each
step produces one [BLOCK_L, bco] output tile: a lax.fori_loop over the K taps reads the window
x[t0 + k : t0 + k + BLOCK_L] with a dynamic row offset and w[k] with a dynamic tap index, and
sums the MXU products in the loop's f32 carry, which is cast and stored once. There is no Cin
split, no accumulator scratch and no halo block: the overlap between neighbouring tiles is
simply read from the resident sequence.

Padding: the wrapper zero-pads the sequence to n_l * BLOCK_L + K - 1 rows so the last tile's
windows stay inside the block (padded rows only feed output rows past L - K + 1, which fall
in the ragged last output block and are never written back). Channels are not padded (the
blocks span all of Cin); a wider Cout ends in a ragged block whose garbage columns are never
written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_L = 256
BLOCK_COUT = 256
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def conv_kernel(x_ref, w_ref, o_ref, *, taps, bl):
    # x_ref: [n_l * bl + K - 1, cin], w_ref: [K, cin, bco], o_ref: [bl, bco].
    t0 = pl.multiple_of(pl.program_id(2) * bl, 8)

    def tap(k, acc):
        window = x_ref[pl.ds(t0 + k, bl), :]                    # rows t0 + k ...
        return acc + jnp.dot(window, w_ref[k], preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, taps, tap, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, w):
    b, length, cin = x.shape
    taps, cin_w, cout = w.shape
    if cin != cin_w:
        raise ValueError(f"channel mismatch: {x.shape=} {w.shape=}")
    l_out = length - taps + 1
    bl = min(BLOCK_L, _round_up(l_out, 8))
    n_l = pl.cdiv(l_out, bl)
    rows_in = n_l * bl + taps - 1                               # >= length
    xp = jnp.pad(x, ((0, 0), (0, rows_in - length), (0, 0)))
    bco = cout if cout <= BLOCK_COUT else BLOCK_COUT
    itemsize = x.dtype.itemsize
    need = (2 * (rows_in * cin + taps * cin * bco + bl * bco) * itemsize
            + bl * cin * itemsize + 3 * bl * bco * 4)
    return pl.pallas_call(
        functools.partial(conv_kernel, taps=taps, bl=bl),
        grid=(b, pl.cdiv(cout, bco), n_l),
        in_specs=[pl.BlockSpec((None, rows_in, cin), lambda bb, co, l: (bb, 0, 0)),
                  pl.BlockSpec((taps, cin, bco), lambda bb, co, l: (0, 0, co))],
        out_specs=pl.BlockSpec((None, bl, bco), lambda bb, co, l: (bb, l, co)),
        out_shape=jax.ShapeDtypeStruct((b, l_out, cout), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(xp, w)
