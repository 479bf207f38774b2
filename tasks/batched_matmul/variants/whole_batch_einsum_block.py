"""Batched matmul with the whole batch folded into every block and one batched dot per step.

Grid (M tiles, N tiles, K tiles): the batch is not a grid axis at all. Each block carries all
B batch entries ([B, bm, bk] of a, [B, bk, bn] of b, [B, bm, bn] of the output) and the kernel
issues one batched contraction, `einsum("bmk,bkn->bmn")` (a dot_general with a batch
dimension), instead of looping over entries. The grid is therefore B times shorter than a
one-entry-per-step grid, and every entry's tile pair moves in the same DMA.

Accumulation: for float32 output the output block (resident across the "arbitrary" K axis)
is the accumulator; for bfloat16 output an f32 VMEM scratch accumulates and is cast once.

Ragged edges: M and N use `pl.cdiv` grids (garbage rows / columns of edge blocks only reach
outputs never written back; batch entries never mix in a batched dot). K is zero-padded to
whole blocks, which adds nothing. The tiles are smaller than a per-entry kernel's so that
B of them fit VMEM.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these), per batch entry; every block holds
# all B entries. Blocks never exceed the dims.
BLOCK_M = 256
BLOCK_N = 256
BLOCK_K = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def bmm_kernel(a_ref, b_ref, o_ref, *scratch):
    # a_ref: [B, bm, bk], b_ref: [B, bk, bn], o_ref: [B, bm, bn]
    acc_ref = scratch[0] if scratch else o_ref   # f32 output: accumulate in place
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.einsum("bmk,bkn->bmn", a_ref[...], b_ref[...],
                               preferred_element_type=jnp.float32)

    if scratch:
        @pl.when(kk == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(batch, bm, bn, bk, itemsize, separate_acc):
    """Double-buffered blocks, the f32 product (and accumulator), plus headroom; at least
    32 MiB, at most 100 MiB."""
    need = (2 * batch * (bm * bk + bk * bn + bm * bn) * itemsize + batch * bm * bn * 4
            + (batch * bm * bn * 4 if separate_acc else 0))
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _bmm(a, b, *, bm, bn, bk):
    batch, m, k = a.shape
    n = b.shape[2]
    kp = _round_up(k, bk)
    ap = jnp.pad(a, ((0, 0), (0, 0), (0, kp - k)))
    bp = jnp.pad(b, ((0, 0), (0, kp - k), (0, 0)))
    separate_acc = a.dtype != jnp.float32
    return pl.pallas_call(
        bmm_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((batch, bm, bk), lambda i, j, kk: (0, i, kk)),
            pl.BlockSpec((batch, bk, bn), lambda i, j, kk: (0, kk, j)),
        ],
        out_specs=pl.BlockSpec((batch, bm, bn), lambda i, j, kk: (0, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, m, n), a.dtype),
        scratch_shapes=([pltpu.VMEM((batch, bm, bn), jnp.float32)] if separate_acc else []),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(batch, bm, bn, bk, a.dtype.itemsize, separate_acc)),
    )(ap, bp)


def kernel(a, b):
    batch, m, k = a.shape
    batch2, k2, n = b.shape
    if batch != batch2 or k != k2:
        raise ValueError(f"shape mismatch: {a.shape=} {b.shape=}")
    return _bmm(a, b, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=_block(k, BLOCK_K))
