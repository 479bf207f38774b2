"""SwiGLU MLP as two pallas_calls: the gated hidden layer, then the down projection.

1. Hidden kernel, grid (row tiles, hidden tiles, D chunks) with the contraction dim D as the
   innermost "arbitrary" reduction axis: each step adds x[i, k] @ w_gate[k, j] and
   x[i, k] @ w_up[k, j] into two f32 VMEM scratch accumulators [bm, bf]; at the last D chunk it
   writes h = silu(gate) * up (in x's dtype, as the fused kernel feeds the MXU) to HBM.
2. Down kernel, grid (row tiles, output column tiles, hidden chunks), hidden axis innermost and
   "arbitrary": an f32 VMEM scratch accumulator [bm, bn] collects h[i, k] @ w_down[k, n] and is
   stored at the last hidden chunk.
The [M, F] hidden activation makes one round trip through HBM (smaller than the weights at
every case), in exchange for small, independent blocks in both kernels.

Edges: everything is zero-padded in the wrapper: M to the row block, D to a multiple of 128
(zero contraction terms), F to the hidden block (silu(0) * 0 = 0, and zero w_down rows). The
padding is sliced off the result.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 512
BLOCK_F = 512
BLOCK_K = 512    # D chunk of the hidden kernel
BLOCK_N = 1024   # output column tile of the down kernel

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _tile(n, preferred, align):
    """n when it is at most `preferred`, else the largest multiple of `align` <= preferred
    dividing n (n is a multiple of `align`)."""
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _limit(need):
    return min(100 * _MiB, max(32 * _MiB, 2 * need + 4 * _MiB))


def hidden_kernel(x_ref, wg_ref, wu_ref, h_ref, gate_acc, up_acc):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _zero():
        gate_acc[...] = jnp.zeros_like(gate_acc)
        up_acc[...] = jnp.zeros_like(up_acc)

    x = x_ref[...]
    gate_acc[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_acc[...] += jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _activate():
        gate = gate_acc[...]
        h_ref[...] = (gate * jax.nn.sigmoid(gate) * up_acc[...]).astype(h_ref.dtype)


def down_kernel(h_ref, wd_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(h_ref[...], wd_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _swiglu(x, w_gate, w_up, w_down, *, bm, bf):
    m, d = x.shape
    f = w_gate.shape[1]
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    bk = _tile(dp, BLOCK_K, 128)
    bn = _tile(dp, BLOCK_N, 128)
    isz = x.dtype.itemsize
    xp = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    wgp = jnp.pad(w_gate, ((0, dp - d), (0, fp - f)))
    wup = jnp.pad(w_up, ((0, dp - d), (0, fp - f)))
    wdp = jnp.pad(w_down, ((0, fp - f), (0, dp - d)))

    need1 = 2 * (bm * bk + 2 * bk * bf + bm * bf) * isz + 2 * bm * bf * 4
    h = pl.pallas_call(
        hidden_kernel,
        grid=(mp // bm, fp // bf, dp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bf), lambda i, j, k: (k, j)),
            pl.BlockSpec((bk, bf), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((bm, bf), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, fp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bf), jnp.float32), pltpu.VMEM((bm, bf), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_limit(need1)),
    )(xp, wgp, wup)

    need2 = 2 * (bm * bf + bf * bn + bm * bn) * isz + bm * bn * 4
    out = pl.pallas_call(
        down_kernel,
        grid=(mp // bm, dp // bn, fp // bf),
        in_specs=[
            pl.BlockSpec((bm, bf), lambda i, n, k: (i, k)),
            pl.BlockSpec((bf, bn), lambda i, n, k: (k, n)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, n, k: (i, n)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_limit(need2)),
    )(h, wdp)
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
