"""Batched matmul a[B, M, K] @ b[B, K, N]: one tiled matmul per batch entry, all in one grid.

Grid (B, M tiles, N tiles, K tiles). The batch dim is squeezed out of every block, so the
kernel body sees plain 2-D tiles. The batch, M and N axes are independent ("parallel": on
chips with two TensorCores they are split between the cores); K is last and "arbitrary",
accumulating into an f32 VMEM scratch that is cast to a.dtype at the last K step.

Block sizes: a is re-read once per N tile and b once per M tile, and every grid step costs a
fixed overhead, so the blocks are large (512 x 2048 output tiles, K in 2048 slices: at
2048^3 a batch entry takes 4 steps, b stays resident across them and each operand is read
once). A dim no larger than its block is one whole-dim block; M and N edges are ragged blocks
(no padded copies), only K is zero-padded when it spans several blocks. The VMEM limit is
raised to fit the blocks.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims,
# so check-size grids stay small.
BLOCK_M = 512
BLOCK_N = 2048
BLOCK_K = 2048
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


def bmm_kernel(a_ref, b_ref, o_ref, acc_ref):
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered blocks, the f32 accumulator and the f32 product, plus headroom; at
    least 32 MiB, at most 100 MiB."""
    need = 2 * (bm * bk + bk * bn + bm * bn) * itemsize + 2 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _bmm(a, b, *, bm, bn, bk):
    batch, m, k = a.shape
    n = b.shape[2]
    # Only K is padded (zeros add nothing to the sum); ragged last M and N blocks hold
    # garbage rows/cols past the edge that only reach output elements Pallas never writes.
    kp = _round_up(k, bk)
    ap = jnp.pad(a, ((0, 0), (0, 0), (0, kp - k)))
    bp = jnp.pad(b, ((0, 0), (0, kp - k), (0, 0)))
    out = pl.pallas_call(
        bmm_kernel,
        grid=(batch, pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((pl.Squeezed(), bm, bk), lambda g, i, j, kk: (g, i, kk)),
            pl.BlockSpec((pl.Squeezed(), bk, bn), lambda g, i, j, kk: (g, kk, j)),
        ],
        out_specs=pl.BlockSpec((pl.Squeezed(), bm, bn), lambda g, i, j, kk: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, a.dtype.itemsize)),
    )(ap, bp)
    return out


def kernel(a, b):
    batch, m, k = a.shape
    batch2, k2, n = b.shape
    if batch != batch2 or k != k2:
        raise ValueError(f"shape mismatch: {a.shape=} {b.shape=}")
    return _bmm(a, b, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=_block(k, BLOCK_K))
