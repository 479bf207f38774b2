"""x[M, K] @ w[N, K]^T with no padded copies: the ragged K tail is masked inside the kernel.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary", an f32 VMEM accumulator. Every grid
dim is `pl.cdiv(dim, block)`, so the last block along any dim may stick out past the array.
For M and N that is harmless: the rows of x / w past the edge only feed output rows / columns
that Pallas never writes back. For K it is not: the out-of-range columns of the last x and w
tiles hold unspecified data (possibly NaN/Inf) and would be summed into real outputs. So on
the last K step the kernel zeroes the columns at global index >= K in BOTH tiles (zeroing one
side is not enough: 0 * NaN = NaN) before contracting them.

This replaces the `jnp.pad` of x and w along K (an extra HBM read + write of both operands)
with a few VPU selects on one tile per output block. The mask is only built on the last K step
(`pl.when`), and only when K is not a multiple of the block (a static check).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tile BLOCK_M x BLOCK_N, K in
# BLOCK_K slices. Blocks never exceed the dims, so check-size grids stay small.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (a whole-dim block is
    always a legal TPU block shape)."""
    return dim if dim <= preferred else preferred


def _contract(x, w):
    # [bm, bk] x [bn, bk] -> [bm, bn], contracting dim 1 of both: the MXU consumes w's tile
    # as stored, no transpose in HBM.
    return lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def matmul_nt_kernel(x_ref, w_ref, o_ref, acc_ref, *, k_total, bk):
    kk = pl.program_id(2)
    last = pl.num_programs(2) - 1

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    if k_total % bk == 0:
        # Every K tile is full: no masking anywhere.
        acc_ref[...] += _contract(x_ref[...], w_ref[...])
    else:
        @pl.when(kk < last)
        def _full_tile():
            acc_ref[...] += _contract(x_ref[...], w_ref[...])

        @pl.when(kk == last)
        def _tail_tile():
            # Global K index of each lane of the tile; lanes >= K are past the array.
            x = x_ref[...]
            w = w_ref[...]
            col_x = kk * bk + lax.broadcasted_iota(jnp.int32, x.shape, 1)
            col_w = kk * bk + lax.broadcasted_iota(jnp.int32, w.shape, 1)
            x = jnp.where(col_x < k_total, x, jnp.zeros_like(x))
            w = jnp.where(col_w < k_total, w, jnp.zeros_like(w))
            acc_ref[...] += _contract(x, w)

    @pl.when(kk == last)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered blocks, masked tile copies, the f32 accumulator and product, plus
    headroom; at least 32 MiB, at most 100 MiB."""
    need = 3 * (bm * bk + bn * bk) * itemsize + 2 * bm * bn * itemsize + 2 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_nt(x, w, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[0]
    return pl.pallas_call(
        functools.partial(matmul_nt_kernel, k_total=k, bk=bk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),  # x tile [bm, bk]
            pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)),  # w tile [bn, bk]
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(x, w)


def kernel(x, w):
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"contracted dims differ: {x.shape=} {w.shape=}")
    return _matmul_nt(x, w, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=_block(k, BLOCK_K))
