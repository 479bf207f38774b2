"""Weight-only int8 matmul with K walked inside each grid step over whole-K panels.

Grid (M tiles, N tiles), both "parallel": there is no K grid axis. Each step receives a
[bm, Kp] row panel of x and a [Kp, bn] int8 column panel of wq (Kp = K rounded up to CHUNK;
the weights still travel from HBM as int8) and a `lax.fori_loop` walks K in CHUNK-row
sub-tiles: each int8 sub-tile is converted to x.dtype (exact, |w| <= 127) and fed to the MXU,
the f32 accumulator travels as the loop carry. The per-column scale commutes with the K sum,
so it multiplies the finished accumulator once, right before the single store.

Ragged edges: K is zero-padded to whole chunks (zero weights add nothing, whatever x holds
there: x is zero-padded too); M and N use `pl.cdiv` grids, and the garbage rows / columns of
edge panels (and of the edge scale block) only reach outputs never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tiles BLOCK_M x BLOCK_N, K in
# CHUNK-row sub-tiles (a multiple of 32: whole int8 sublane tiles). Blocks never exceed dims.
BLOCK_M = 512
BLOCK_N = 512
CHUNK = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def dequant_panel_kernel(x_ref, wq_ref, s_ref, o_ref, *, chunk, n_chunks):
    # x_ref: [bm, Kp], wq_ref: [Kp, bn] int8, s_ref: [1, bn] f32, o_ref: [bm, bn]
    def body(c, acc):
        start = pl.multiple_of(c * chunk, chunk)
        w = wq_ref[pl.ds(start, chunk), :].astype(jnp.float32).astype(x_ref.dtype)
        return acc + jnp.dot(x_ref[:, pl.ds(start, chunk)], w,
                             preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, n_chunks, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = (acc * s_ref[...]).astype(o_ref.dtype)


def _vmem_limit(bm, bn, kp, chunk, itemsize):
    """Double-buffered panels, scale and output blocks, the f32 carry and product, the
    converted weight chunk, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * kp * itemsize + kp * bn + 8 * bn * 4 + bm * bn * itemsize)
            + 3 * bm * bn * 4 + chunk * bn * (4 + itemsize) + bm * chunk * itemsize)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _dequant_matmul(x, wq, scales, *, bm, bn, chunk):
    m, k = x.shape
    n = wq.shape[1]
    kp = _round_up(k, chunk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(wq, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        functools.partial(dequant_panel_kernel, chunk=chunk, n_chunks=kp // chunk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),   # x row panel, all of K
            pl.BlockSpec((kp, bn), lambda i, j: (0, j)),   # int8 weight panel, all of K
            pl.BlockSpec((1, bn), lambda i, j: (0, j)),    # column scales
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(bm, bn, kp, chunk, x.dtype.itemsize)),
    )(xp, wp, scales.astype(jnp.float32).reshape(1, n))


def kernel(x, wq, scales):
    m, k = x.shape
    k2, n = wq.shape
    if k != k2 or scales.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {wq.shape=} {scales.shape=}")
    chunk = min(CHUNK, _round_up(k, 128))
    return _dequant_matmul(x, wq, scales, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                           chunk=chunk)
