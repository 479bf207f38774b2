"""x[M, K] @ w[N, K]^T: both operands tiled along K; the MXU contracts their minor dims directly.

Grid (M tiles, N tiles, K tiles), K last and "arbitrary": an f32 VMEM accumulator collects
x_tile @ w_tile^T over the K tiles and is cast to x.dtype at the last one. w is never
transposed in HBM: each [bn, bk] tile of w is contracted on its last dim inside the kernel.

Block sizes: x is re-read once per N tile and w once per M tile, and every grid step costs a
fixed overhead, so the blocks are large: 1024 x 1024 output tiles with the whole K of 4096 in
one slice, so 4096^3 takes 16 steps and x is read once. A dim no larger than its block is one
whole-dim block; M and N edges are ragged blocks (no padded copies), only K is zero-padded
when it spans several blocks. The VMEM limit is raised to fit the blocks.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims, so
# check-size grids stay small.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 4096
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128 (so a 3000
    dim with preferred 2048 is two blocks of 1536, not 2048 + a mostly empty one)."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


def matmul_nt_kernel(x_ref, w_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # [bm, bk] x [bn, bk] -> [bm, bn], contracting dim 1 of both (no explicit transpose).
    acc_ref[...] += lax.dot_general(x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered blocks, the f32 accumulator and the f32 product, plus headroom; at
    least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bn * bk + bm * bn) * itemsize + 2 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul_nt(x, w, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[0]
    # Only K is padded (zeros add nothing to the sum); ragged last M and N blocks hold
    # garbage rows past the edge that only reach output elements Pallas never writes.
    kp = _round_up(k, bk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, 0), (0, kp - k)))
    return pl.pallas_call(
        matmul_nt_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
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
    )(xp, wp)


def kernel(x, w):
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"contracted dims differ: {x.shape=} {w.shape=}")
    return _matmul_nt(x, w, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=_block(k, BLOCK_K))
