"""1-D convolution as matmuls: one matmul per filter tap over shifted rows of the input.

Grid (batch, Cout tiles, Cin tiles) with the Cin axis last: for one output tile the kernel
sums x[t + k, cin_tile] @ w[k, cin_tile, cout_tile] over the K taps and the Cin tiles in an f32
VMEM accumulator. Channels are zero-padded to multiples of 128 (exact for a convolution); the
whole sequence is one block, so the taps' overlapping windows are plain static slices.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

C = 128  # channel tile


def conv_kernel(x_ref, w_ref, o_ref, acc_ref, *, taps, l_out):
    ci = pl.program_id(2)

    @pl.when(ci == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc = acc_ref[...]                                   # [l_out, C]
    for k in range(taps):                                # static: K is a shape
        window = x_ref[k:k + l_out, :]                   # [l_out, C] rows t + k
        acc = acc + jnp.dot(window, w_ref[k], preferred_element_type=jnp.float32)
    acc_ref[...] = acc

    @pl.when(ci == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, w):
    b, length, cin = x.shape
    taps, cin_w, cout = w.shape
    if cin != cin_w:
        raise ValueError(f"channel mismatch: {x.shape=} {w.shape=}")
    l_out = length - taps + 1
    xp = jnp.pad(x, ((0, 0), (0, 0), (0, -cin % C)))
    wp = jnp.pad(w, ((0, 0), (0, -cin % C), (0, -cout % C)))
    cin_p, cout_p = xp.shape[2], wp.shape[2]
    out = pl.pallas_call(
        functools.partial(conv_kernel, taps=taps, l_out=l_out),
        grid=(b, cout_p // C, cin_p // C),
        in_specs=[pl.BlockSpec((None, length, C), lambda bb, co, ci: (bb, 0, ci)),
                  pl.BlockSpec((taps, C, C), lambda bb, co, ci: (0, ci, co))],
        out_specs=pl.BlockSpec((None, l_out, C), lambda bb, co, ci: (bb, 0, co)),
        out_shape=jax.ShapeDtypeStruct((b, l_out, cout_p), x.dtype),
        scratch_shapes=[pltpu.VMEM((l_out, C), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, wp)
    return out[:, :, :cout]
