"""SwiGLU MLP with the gate and up weights interleaved into one matrix: one MXU dot per F tile.

The wrapper lays w_gate and w_up out side by side per hidden tile: w_gu[:, 2*j*bf : 2*j*bf+bf]
is w_gate's tile j and the next bf columns are w_up's tile j (pad, reshape and stack only). A
single [bm, D] @ [D, 2*bf] dot per grid step therefore yields gate and up together; the kernel
splits the result at the lane-aligned column bf, forms h = silu(gate) * up and adds
h @ w_down[j] into an f32 VMEM scratch accumulator [bm, D]. Grid (row tiles, hidden tiles),
hidden axis innermost and "arbitrary"; the output row tile is stored after the last hidden tile.

Edges: rows are NOT padded: the row axis is a `pl.cdiv` grid and the last row block is ragged
(rows are independent, so garbage rows past M only feed output rows that are never written
back). D is zero-padded to a multiple of 128 (padded contraction terms add nothing) and F to
the hidden tile (padded hidden units give silu(0) * 0 = 0 and meet zero w_down rows).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 512
BLOCK_F = 512

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _kernel(x_ref, wgu_ref, wd_ref, o_ref, acc_ref, *, bf):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    gu = jnp.dot(x_ref[...], wgu_ref[...], preferred_element_type=jnp.float32)  # [bm, 2 bf]
    gate = gu[:, :bf]
    up = gu[:, bf:]
    h = gate * jax.nn.sigmoid(gate) * up
    acc_ref[...] += jnp.dot(h.astype(wd_ref.dtype), wd_ref[...],
                            preferred_element_type=jnp.float32)

    @pl.when(j == pl.num_programs(1) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _swiglu(x, w_gate, w_up, w_down, *, bm, bf):
    m, d = x.shape
    f = w_gate.shape[1]
    dp, fp = _round_up(d, 128), _round_up(f, bf)
    nf = fp // bf
    xp = jnp.pad(x, ((0, 0), (0, dp - d)))
    wg = jnp.pad(w_gate, ((0, dp - d), (0, fp - f))).reshape(dp, nf, 1, bf)
    wu = jnp.pad(w_up, ((0, dp - d), (0, fp - f))).reshape(dp, nf, 1, bf)
    wgu = jnp.concatenate([wg, wu], axis=2).reshape(dp, 2 * fp)   # per tile: [gate | up]
    wdp = jnp.pad(w_down, ((0, fp - f), (0, dp - d)))
    isz = x.dtype.itemsize
    need = (2 * 2 * bm * dp * isz + 2 * 3 * dp * bf * isz + bm * dp * 4 + 6 * bm * bf * 4)
    out = pl.pallas_call(
        functools.partial(_kernel, bf=bf),
        grid=(pl.cdiv(m, bm), nf),
        in_specs=[
            pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
            pl.BlockSpec((dp, 2 * bf), lambda i, j: (0, j)),
            pl.BlockSpec((bf, dp), lambda i, j: (j, 0)),
        ],
        out_specs=pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, dp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, dp), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))),
    )(xp, wgu, wdp)
    return out[:, :d]


def kernel(x, w_gate, w_up, w_down):
    m, d = x.shape
    f = w_gate.shape[1]
    if w_gate.shape != (d, f) or w_up.shape != (d, f) or w_down.shape != (f, d):
        raise ValueError(f"shape mismatch: {x.shape=} {w_gate.shape=} {w_up.shape=} "
                         f"{w_down.shape=}")
    bm = m if m <= BLOCK_M else BLOCK_M   # the full dim when small, else a multiple of 16
    bf = min(BLOCK_F, _round_up(f, 128))
    return _swiglu(x, w_gate, w_up, w_down, bm=bm, bf=bf)
