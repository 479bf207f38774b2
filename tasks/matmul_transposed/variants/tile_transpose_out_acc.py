"""x[M, K] @ w[N, K]^T by transposing each w tile in VMEM, then a plain (NN) MXU matmul.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary". w is still read from HBM in its
stored [N, K] layout, one [bn, bk] tile per step, but instead of handing the MXU
transposed-operand dimension numbers the kernel relayouts the tile explicitly
(`w_tile.T`, [bk, bn], an XLU transpose in VMEM) and calls an ordinary `jnp.dot`.
Accumulation: for float32 output the output block, resident across K, is the accumulator
(no scratch, no final copy); for bfloat16 output an f32 VMEM scratch accumulates and is cast
on the last K step.

Ragged edges: M and N use `pl.cdiv` grids (garbage rows of edge x / w tiles only reach
outputs never written back); K is zero-padded to whole blocks on both operands (exact).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def matmul_tt_kernel(x_ref, w_ref, o_ref, *scratch):
    acc_ref = scratch[0] if scratch else o_ref   # f32 output: accumulate in place
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w_t = w_ref[...].T                            # [bn, bk] -> [bk, bn] in VMEM
    acc_ref[...] += jnp.dot(x_ref[...], w_t, preferred_element_type=jnp.float32)

    if scratch:
        @pl.when(kk == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize, separate_acc):
    """Double-buffered blocks, the transposed w tile, the f32 product (and accumulator),
    plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * bk + bn * bk + bm * bn) * itemsize + bn * bk * itemsize
            + bm * bn * 4 + (bm * bn * 4 if separate_acc else 0))
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_nt(x, w, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[0]
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, 0), (0, kp - k)))
    separate_acc = x.dtype != jnp.float32
    return pl.pallas_call(
        matmul_tt_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),   # x tile [bm, bk]
            pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)),   # w tile [bn, bk], as stored
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)] if separate_acc else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize, separate_acc)),
    )(xp, wp)


def kernel(x, w):
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"contracted dims differ: {x.shape=} {w.shape=}")
    bk = min(BLOCK_K, _round_up(k, 128))   # lane dim of both tiles and of the transposed one
    return _matmul_nt(x, w, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=bk)
