"""1-D convolution as one im2col matmul per sequence chunk, built inside the kernel.

For output rows [t0, t0 + C) the kernel copies the K shifted input windows x[t0 + k : t0 + k + C]
side by side into a [C, K * Cin_p] VMEM scratch (the im2col patch matrix) and does a single
MXU matmul against the filter flattened to [K * Cin_p, Cout] (a free reshape in the wrapper):
one deep contraction of depth K * Cin_p instead of K shallow matmuls summed into an
accumulator. A lax.fori_loop walks the sequence in chunks of CHUNK_L rows inside one grid
step, so the patch scratch stays small whatever the length; each chunk's result goes straight
into its rows of the output block (no accumulator scratch, no Cin grid axis).

Grid: (batch, Cout blocks), both "parallel"; x's block is the whole (padded) sequence with all
channels and keeps its block index across Cout blocks, so it is fetched once per sample.

Padding (all in the wrapper, all exact for a convolution): Cin is zero-padded to a multiple of
128 so each tap's slot in the patch matrix is lane-aligned (w gets matching zero rows); the
sequence is zero-padded so that n_chunks * CHUNK_L output rows exist, and the output is
computed at that padded length and sliced back to L - K + 1 rows. A wider Cout ends in a
ragged block whose garbage columns are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK_L = 256
BLOCK_COUT = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def conv_kernel(x_ref, w_ref, o_ref, patch_ref, *, taps, cin_p, chunk, n_chunks):
    # x_ref: [L_pad + K - 1, cin_p], w_ref: [K * cin_p, bco], o_ref: [L_pad, bco],
    # patch_ref: [chunk, K * cin_p].
    def body(c, carry):
        r0 = pl.multiple_of(c * chunk, 8)
        for k in range(taps):                                   # static: K is a shape
            patch_ref[:, k * cin_p:(k + 1) * cin_p] = x_ref[pl.ds(r0 + k, chunk), :]
        out = jnp.dot(patch_ref[...], w_ref[...], preferred_element_type=jnp.float32)
        o_ref[pl.ds(r0, chunk), :] = out.astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, n_chunks, body, 0)


def kernel(x, w):
    b, length, cin = x.shape
    taps, cin_w, cout = w.shape
    if cin != cin_w:
        raise ValueError(f"channel mismatch: {x.shape=} {w.shape=}")
    l_out = length - taps + 1
    cin_p = _round_up(cin, 128)
    chunk = min(CHUNK_L, _round_up(l_out, 8))
    n_chunks = pl.cdiv(l_out, chunk)
    l_pad = n_chunks * chunk
    rows_in = l_pad + taps - 1                                  # >= length
    xp = jnp.pad(x, ((0, 0), (0, rows_in - length), (0, cin_p - cin)))
    wp = jnp.pad(w, ((0, 0), (0, cin_p - cin), (0, 0))).reshape(taps * cin_p, cout)
    bco = cout if cout <= BLOCK_COUT else BLOCK_COUT
    itemsize = x.dtype.itemsize
    need = (2 * (rows_in * cin_p + taps * cin_p * bco + l_pad * bco) * itemsize
            + chunk * taps * cin_p * itemsize + 2 * chunk * bco * 4)
    out = pl.pallas_call(
        functools.partial(conv_kernel, taps=taps, cin_p=cin_p, chunk=chunk, n_chunks=n_chunks),
        grid=(b, pl.cdiv(cout, bco)),
        in_specs=[pl.BlockSpec((None, rows_in, cin_p), lambda bb, co: (bb, 0, 0)),
                  pl.BlockSpec((taps * cin_p, bco), lambda bb, co: (0, co))],
        out_specs=pl.BlockSpec((None, l_pad, bco), lambda bb, co: (bb, 0, co)),
        out_shape=jax.ShapeDtypeStruct((b, l_pad, cout), x.dtype),
        scratch_shapes=[pltpu.VMEM((chunk, taps * cin_p), x.dtype)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(xp, wp)
    return out[:, :l_out, :]
