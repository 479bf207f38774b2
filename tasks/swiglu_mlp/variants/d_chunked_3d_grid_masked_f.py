"""Fused SwiGLU MLP on a 3-D grid whose innermost axis chunks the contraction dim D.

Grid (row tiles i, hidden tiles j, D chunks k); j and k are "arbitrary". The gate and up
projections of a [bm, bf] hidden slab are accumulated over the D chunks in two f32 VMEM
scratch buffers (x and the weights arrive as small [bm, bk] / [bk, bf] blocks instead of
full-D rows). At the last D chunk the slab is activated, h = silu(gate) * up, and h @ w_down[j]
(a [bf, D] block, fetched once per hidden tile since its index ignores k) is added into a third
f32 VMEM scratch accumulator [bm, D] that lives across the whole (j, k) sweep of a row tile.
The output row block is stored after the last (j, k) step. The hidden activation never
reaches HBM.

Edges: the hidden dim F is NOT padded: the hidden axis is a `pl.cdiv` grid and the kernel masks
the ragged last tile itself (hidden columns >= F are zeroed in h and the matching rows of the
w_down block are zeroed, so stale VMEM contents cannot leak in, even as NaN). D is zero-padded
to a multiple of 128 and M to the row block in the wrapper; the padding is sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 512
BLOCK_F = 512
BLOCK_K = 512

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _tile(n, preferred, align):
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _kernel(x_ref, wg_ref, wu_ref, wd_ref, o_ref, gate_acc, up_acc, out_acc, *, f_true, bf):
    j = pl.program_id(1)
    k = pl.program_id(2)
    last_k = k == pl.num_programs(2) - 1

    @pl.when((j == 0) & (k == 0))
    def _zero_out():
        out_acc[...] = jnp.zeros_like(out_acc)

    @pl.when(k == 0)
    def _zero_slab():
        gate_acc[...] = jnp.zeros_like(gate_acc)
        up_acc[...] = jnp.zeros_like(up_acc)

    x = x_ref[...]
    gate_acc[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_acc[...] += jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)

    @pl.when(last_k)
    def _down():
        gate = gate_acc[...]
        h = gate * jax.nn.sigmoid(gate) * up_acc[...]                       # [bm, bf]
        col = j * bf + jax.lax.broadcasted_iota(jnp.int32, h.shape, 1)
        h = jnp.where(col < f_true, h, 0.0)
        wd = wd_ref[...]
        row = j * bf + jax.lax.broadcasted_iota(jnp.int32, wd.shape, 0)
        wd = jnp.where(row < f_true, wd, jnp.zeros_like(wd))
        out_acc[...] += jnp.dot(h.astype(wd.dtype), wd, preferred_element_type=jnp.float32)

    @pl.when(last_k & (j == pl.num_programs(1) - 1))
    def _store():
        o_ref[...] = out_acc[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _swiglu(x, w_gate, w_up, w_down, *, bm, bf):
    m, d = x.shape
    f = w_gate.shape[1]
    mp, dp = _round_up(m, bm), _round_up(d, 128)
    bk = _tile(dp, BLOCK_K, 128)
    xp = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    wgp = jnp.pad(w_gate, ((0, dp - d), (0, 0)))
    wup = jnp.pad(w_up, ((0, dp - d), (0, 0)))
    wdp = jnp.pad(w_down, ((0, 0), (0, dp - d)))
    isz = x.dtype.itemsize
    need = (2 * (bm * bk + 2 * bk * bf + bf * dp + bm * dp) * isz
            + 2 * bm * bf * 4 + bm * dp * 4 + 4 * bm * bf * 4)
    out = pl.pallas_call(
        functools.partial(_kernel, f_true=f, bf=bf),
        grid=(mp // bm, pl.cdiv(f, bf), dp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bf), lambda i, j, k: (k, j)),
            pl.BlockSpec((bk, bf), lambda i, j, k: (k, j)),
            pl.BlockSpec((bf, dp), lambda i, j, k: (j, 0)),
        ],
        out_specs=pl.BlockSpec((bm, dp), lambda i, j, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bf), jnp.float32),    # gate over D chunks
                        pltpu.VMEM((bm, bf), jnp.float32),    # up over D chunks
                        pltpu.VMEM((bm, dp), jnp.float32)],   # output over hidden tiles
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))),
    )(xp, wgp, wup, wdp)
    return out[:m, :d]


def kernel(x, w_gate, w_up, w_down):
    m, d = x.shape
    f = w_gate.shape[1]
    if w_gate.shape != (d, f) or w_up.shape != (d, f) or w_down.shape != (f, d):
        raise ValueError(f"shape mismatch: {x.shape=} {w_gate.shape=} {w_up.shape=} "
                         f"{w_down.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm = min(BLOCK_M, _round_up(m, sublane))
    bf = min(BLOCK_F, _round_up(f, 128))
    return _swiglu(x, w_gate, w_up, w_down, bm=bm, bf=bf)
