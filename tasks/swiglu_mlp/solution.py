"""Fused SwiGLU MLP: (silu(x @ w_gate) * (x @ w_up)) @ w_down in one kernel.

Grid (M tiles, F tiles, D tiles). For one row tile the kernel walks the hidden dim F in tiles;
for each F tile the innermost D loop accumulates the gate and up projections into two f32 VMEM
scratch tiles [bm, bf]. After the last D step it forms h = silu(gate) * up for that F tile and
adds h @ w_down[f tile, :] into an f32 VMEM accumulator [bm, D]; the [M, F] hidden activation
never exists in HBM. The output row tile is stored once, after the last F tile. Zero padding is
exact: padded D adds nothing, padded F columns give silu(0) * 0 = 0.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_VMEM_BUDGET = 10 * 1024 * 1024  # pipelined blocks (x2 buffers) + scratch, bytes


def _round_up(x, m):
    return (x + m - 1) // m * m


def _vmem_bytes(bm, bf, bk, d, itemsize):
    return (2 * bm * bk * itemsize          # x blocks
            + 2 * 2 * bk * bf * itemsize    # w_gate and w_up blocks
            + 2 * bf * d * itemsize         # w_down blocks
            + 2 * bm * d * itemsize         # output blocks
            + bm * d * 4                    # f32 output accumulator
            + 2 * bm * bf * 4)              # f32 gate and up accumulators


def _choose_blocks(m, d, f, dtype):
    itemsize = jnp.dtype(dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    dp = _round_up(d, 128)
    for bm in (256, 128, 64, 32, 16):
        bm = min(max(bm, sublane), _round_up(m, sublane))
        for bf in (256, 128):
            bf = min(bf, _round_up(f, 128))
            for bk in (512, 256, 128):
                bk = min(bk, dp)
                if _vmem_bytes(bm, bf, bk, _round_up(dp, bk), itemsize) <= _VMEM_BUDGET:
                    return bm, bf, bk
    raise ValueError(f"D={d} is too wide for one VMEM row block")


def swiglu_kernel(x_ref, wg_ref, wu_ref, wd_ref, o_ref, gate_ref, up_ref, acc_ref):
    f = pl.program_id(1)
    k = pl.program_id(2)
    nf = pl.num_programs(1)
    nk = pl.num_programs(2)

    @pl.when((f == 0) & (k == 0))
    def _init_out():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(k == 0)
    def _init_hidden():
        gate_ref[...] = jnp.zeros_like(gate_ref)
        up_ref[...] = jnp.zeros_like(up_ref)

    x = x_ref[...]
    gate_ref[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_ref[...] += jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == nk - 1)
    def _down():
        g = gate_ref[...]
        h = g * jax.nn.sigmoid(g) * up_ref[...]           # [bm, bf] f32
        acc_ref[...] += jnp.dot(h.astype(wd_ref.dtype), wd_ref[...],
                                preferred_element_type=jnp.float32)

    @pl.when((f == nf - 1) & (k == nk - 1))
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf", "bk"))
def _swiglu(x, w_gate, w_up, w_down, *, bm, bf, bk):
    m, d = x.shape
    f = w_gate.shape[1]
    mp, dp, fp = _round_up(m, bm), _round_up(d, bk), _round_up(f, bf)
    xp = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    wgp = jnp.pad(w_gate, ((0, dp - d), (0, fp - f)))
    wup = jnp.pad(w_up, ((0, dp - d), (0, fp - f)))
    wdp = jnp.pad(w_down, ((0, fp - f), (0, dp - d)))
    out = pl.pallas_call(
        swiglu_kernel,
        grid=(mp // bm, fp // bf, dp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),   # x
            pl.BlockSpec((bk, bf), lambda i, j, kk: (kk, j)),   # w_gate
            pl.BlockSpec((bk, bf), lambda i, j, kk: (kk, j)),   # w_up
            pl.BlockSpec((bf, dp), lambda i, j, kk: (j, 0)),    # w_down: refetched per F tile
        ],
        out_specs=pl.BlockSpec((bm, dp), lambda i, j, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), x.dtype),
        scratch_shapes=[
            pltpu.VMEM((bm, bf), jnp.float32),   # gate projection of the current F tile
            pltpu.VMEM((bm, bf), jnp.float32),   # up projection of the current F tile
            pltpu.VMEM((bm, dp), jnp.float32),   # output accumulator over F tiles
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    )(xp, wgp, wup, wdp)
    return out[:m, :d]


def kernel(x, w_gate, w_up, w_down):
    m, d = x.shape
    f = w_gate.shape[1]
    if w_gate.shape != (d, f) or w_up.shape != (d, f) or w_down.shape != (f, d):
        raise ValueError(f"shape mismatch: {x.shape=} {w_gate.shape=} {w_up.shape=} "
                         f"{w_down.shape=}")
    bm, bf, bk = _choose_blocks(m, d, f, x.dtype)
    return _swiglu(x, w_gate, w_up, w_down, bm=bm, bf=bf, bk=bk)
