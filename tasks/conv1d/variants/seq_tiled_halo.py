"""1-D convolution with the sequence tiled into blocks plus a small halo block.

out[b, t, :] = sum_k x[b, t + k, :] @ w[k], so an output block of rows [t0, t0 + bl) needs
input rows [t0, t0 + bl + K - 1): its own bl rows plus K - 1 rows of the next block. BlockSpecs
cannot overlap, so x is passed twice: once with [bl, bci] blocks (the body) and once with
[hb, bci] blocks (the halo, hb >= K - 1 rows, a power of two dividing bl) indexed at the
first hb rows after the body. The kernel copies body and halo into one contiguous
[bl + hb, bci] VMEM window and then, per tap k, multiplies the static row slice
window[k:k + bl] by w[k] on the MXU into an f32 VMEM accumulator.

Grid (batch, L blocks, Cout blocks, Cin blocks), Cin last and "arbitrary" (summed into the
accumulator), the rest "parallel". Unlike holding a whole sequence per grid step, VMEM use is
bounded by BLOCK_L whatever the sequence length, and long sequences give many parallel steps.

Padding: x is zero-padded along L so the halo block after the last body block exists (only
output rows past l_out ever read padded rows, and those are never written back: the output
grid's last L block is ragged), and along Cin to whole blocks (zeros are exact). A wider
Cout ends in a ragged block whose garbage columns are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output rows per block (a multiple
# of 8) and channel blocks (multiples of 128).
BLOCK_L = 512
BLOCK_CIN = 512
BLOCK_COUT = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger."""
    return dim if dim <= preferred else preferred


def _halo_rows(taps):
    """Smallest power of two >= max(8, taps - 1): enough rows for the taps' overhang, and a
    divisor of any power-of-two row block at least as large."""
    hb = 8
    while hb < taps - 1:
        hb *= 2
    return hb


def conv_kernel(x_ref, halo_ref, w_ref, o_ref, win_ref, acc_ref, *, taps):
    # x_ref: [bl, bci] body rows, halo_ref: [hb, bci] the next rows, w_ref: [K, bci, bco],
    # o_ref / acc_ref: [bl, bco], win_ref: [bl + hb, bci] contiguous input window.
    ci = pl.program_id(3)
    bl = x_ref.shape[0]

    @pl.when(ci == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    win_ref[:bl, :] = x_ref[...]
    win_ref[bl:, :] = halo_ref[...]

    acc = acc_ref[...]
    for k in range(taps):                   # static: K is a shape
        acc = acc + jnp.dot(win_ref[k:k + bl, :], w_ref[k],
                            preferred_element_type=jnp.float32)
    acc_ref[...] = acc

    @pl.when(ci == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, w):
    b, length, cin = x.shape
    taps, cin_w, cout = w.shape
    if cin != cin_w:
        raise ValueError(f"channel mismatch: {x.shape=} {w.shape=}")
    l_out = length - taps + 1
    hb = _halo_rows(taps)
    # Row block: BLOCK_L or the whole (rounded) output length, a multiple of hb.
    bl = _round_up(min(BLOCK_L, l_out), hb)
    n_l = pl.cdiv(l_out, bl)
    bci, bco = _block(cin, BLOCK_CIN), _block(cout, BLOCK_COUT)
    cin_p = _round_up(cin, bci)
    # Rows up to n_l * bl + hb must exist for the last block's halo (length <= that bound,
    # since K - 1 <= hb and l_out <= n_l * bl).
    xp = jnp.pad(x, ((0, 0), (0, n_l * bl + hb - length), (0, cin_p - cin)))
    wp = jnp.pad(w, ((0, 0), (0, cin_p - cin), (0, 0)))
    halo_stride = bl // hb       # halo block index of the rows right after body block l
    itemsize = x.dtype.itemsize
    need = (2 * ((bl + hb) * bci + taps * bci * bco + bl * bco) * itemsize   # pipelined blocks
            + (bl + hb) * bci * itemsize + 3 * bl * bco * 4)                # window, acc, temps
    return pl.pallas_call(
        functools.partial(conv_kernel, taps=taps),
        grid=(b, n_l, pl.cdiv(cout, bco), cin_p // bci),
        in_specs=[
            pl.BlockSpec((None, bl, bci), lambda bb, l, co, ci: (bb, l, ci)),
            pl.BlockSpec((None, hb, bci), lambda bb, l, co, ci: (bb, (l + 1) * halo_stride, ci)),
            pl.BlockSpec((taps, bci, bco), lambda bb, l, co, ci: (0, ci, co)),
        ],
        out_specs=pl.BlockSpec((None, bl, bco), lambda bb, l, co, ci: (bb, l, co)),
        out_shape=jax.ShapeDtypeStruct((b, l_out, cout), x.dtype),
        scratch_shapes=[pltpu.VMEM((bl + hb, bci), x.dtype),
                        pltpu.VMEM((bl, bco), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(xp, xp, wp)
