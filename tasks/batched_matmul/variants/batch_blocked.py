"""Batched matmul a[B, M, K] @ b[B, K, N] with several batch entries per grid step.

Grid (B blocks, M tiles, N tiles, K tiles). Unlike a grid with one batch entry per step, each
block here carries BLOCK_B batch entries: a [bb, bm, bk] tile of a, a [bb, bk, bn] tile of b
and a [bb, bm, bn] f32 VMEM accumulator. Inside the kernel a `fori_loop` walks the bb
entries (a dynamic index on the leading, untiled dim is a plain address offset) and runs one
2-D MXU matmul per entry. For many small matrices (decode-style B x 1 x K) this divides the
number of grid steps, and so the fixed per-step cost, by BLOCK_B.

The batch, M and N axes are independent ("parallel"); K is last and "arbitrary". Ragged
edges: B, M and N use `pl.cdiv` grids, and the out-of-range batch entries / rows / columns of
an edge block only produce outputs that Pallas never writes back (each batch entry is an
independent matmul, so garbage cannot leak between entries). K is zero-padded to whole
blocks, which is exact for a matmul.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). BLOCK_B batch entries per step, each
# a BLOCK_M x BLOCK_N output tile with K in BLOCK_K slices. Blocks never exceed the dims.
BLOCK_B = 2
BLOCK_M = 512
BLOCK_N = 512
BLOCK_K = 1024
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (a whole-dim block is
    always a legal TPU block shape)."""
    return dim if dim <= preferred else preferred


def bmm_kernel(a_ref, b_ref, o_ref, acc_ref):
    # a_ref: [bb, bm, bk], b_ref: [bb, bk, bn], o_ref / acc_ref: [bb, bm, bn]
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def one_entry(g, carry):
        acc_ref[g] += jnp.dot(a_ref[g], b_ref[g], preferred_element_type=jnp.float32)
        return carry

    jax.lax.fori_loop(0, acc_ref.shape[0], one_entry, 0)

    @pl.when(kk == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bb, bm, bn, bk, itemsize):
    """Double-buffered blocks, the f32 accumulator and one entry's f32 product, plus
    headroom; at least 32 MiB, at most 100 MiB."""
    need = 2 * bb * (bm * bk + bk * bn + bm * bn) * itemsize + bb * bm * bn * 4 + bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bb", "bm", "bn", "bk"))
def _bmm(a, b, *, bb, bm, bn, bk):
    batch, m, k = a.shape
    n = b.shape[2]
    kp = _round_up(k, bk)
    ap = jnp.pad(a, ((0, 0), (0, 0), (0, kp - k)))
    bp = jnp.pad(b, ((0, 0), (0, kp - k), (0, 0)))
    return pl.pallas_call(
        bmm_kernel,
        grid=(pl.cdiv(batch, bb), pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
        in_specs=[
            pl.BlockSpec((bb, bm, bk), lambda g, i, j, kk: (g, i, kk)),
            pl.BlockSpec((bb, bk, bn), lambda g, i, j, kk: (g, kk, j)),
        ],
        out_specs=pl.BlockSpec((bb, bm, bn), lambda g, i, j, kk: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bb, bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bb, bm, bn, bk, a.dtype.itemsize)),
    )(ap, bp)


def kernel(a, b):
    batch, m, k = a.shape
    batch2, k2, n = b.shape
    if batch != batch2 or k != k2:
        raise ValueError(f"shape mismatch: {a.shape=} {b.shape=}")
    return _bmm(a, b, bb=_block(batch, BLOCK_B), bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                bk=_block(k, BLOCK_K))
