"""Matmul on a flattened output-tile grid, with the ragged K tail masked inside the kernel.

Grid (T, K tiles) where T = (M tiles) * (N tiles): the first axis enumerates output tiles in
row-major order and the index maps recover (i, j) = (t // nN, t % nN), so there is one
"parallel" axis to split across cores however unbalanced the M and N tile counts are. K is
the "arbitrary" axis; an f32 VMEM scratch accumulates and is cast on the last K step.

No operand is padded: every extent is `pl.cdiv(dim, block)`. M / N edge blocks carry
garbage rows / columns that only reach outputs never written back. Along K the last tile's
out-of-range lanes of x and rows of y hold unspecified data (possibly NaN / Inf), so on that
step both are zeroed by global index before the dot (zeroing one side alone is not enough:
0 * NaN = NaN). Full K tiles take the unmasked path, and the masked path exists only when
K is not a multiple of the K block (a static check).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 512
_MIB = 1 << 20


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def flat_matmul_kernel(x_ref, y_ref, o_ref, acc_ref, *, k_total, bk):
    kk = pl.program_id(1)
    last = pl.num_programs(1) - 1

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(x, y):
        acc_ref[...] += jnp.dot(x, y, preferred_element_type=jnp.float32)

    if k_total % bk == 0:
        accumulate(x_ref[...], y_ref[...])
    else:
        @pl.when(kk < last)
        def _full():
            accumulate(x_ref[...], y_ref[...])

        @pl.when(kk == last)
        def _tail():
            x = x_ref[...]
            y = y_ref[...]
            kx = kk * bk + lax.broadcasted_iota(jnp.int32, x.shape, 1)   # global K of lanes
            ky = kk * bk + lax.broadcasted_iota(jnp.int32, y.shape, 0)   # global K of rows
            accumulate(jnp.where(kx < k_total, x, jnp.zeros_like(x)),
                       jnp.where(ky < k_total, y, jnp.zeros_like(y)))

    @pl.when(kk == last)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, itemsize):
    """Double-buffered blocks, masked copies, the f32 accumulator and product, plus
    headroom; at least 32 MiB, at most 100 MiB."""
    need = 3 * (bm * bk + bk * bn) * itemsize + 2 * bm * bn * itemsize + 2 * bm * bn * 4
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]
    n_tiles = pl.cdiv(n, bn)
    return pl.pallas_call(
        functools.partial(flat_matmul_kernel, k_total=k, bk=bk),
        grid=(pl.cdiv(m, bm) * n_tiles, pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda t, kk: (t // n_tiles, kk)),
            pl.BlockSpec((bk, bn), lambda t, kk: (kk, t % n_tiles)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda t, kk: (t // n_tiles, t % n_tiles)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, x.dtype.itemsize)),
    )(x, y)


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    return _matmul(x, y, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), bk=_block(k, BLOCK_K))
