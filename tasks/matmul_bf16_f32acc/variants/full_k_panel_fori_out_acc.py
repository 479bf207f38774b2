"""bf16 x bf16 -> f32 matmul with K walked inside one grid step, summing into the f32 output.

Grid (M tiles, N tiles), both "parallel": there is no K grid axis. Each step receives a
[bm, Kp] row panel of x and a [Kp, bn] column panel of y (Kp = K rounded up to CHUNK) and a
`lax.fori_loop` walks K in CHUNK-wide sub-tiles, adding each f32 MXU product straight into
the output block (float32, so it is its own accumulator; bf16 products are exact in f32). The
output tile is zeroed once at the start of the step and finished at its end, so no `pl.when`
phases, no scratch and no cast are needed.

Ragged edges: K is zero-padded to a whole number of chunks (zeros add nothing); M and N use
`pl.cdiv` grids, and the garbage rows / columns of edge panels only reach outputs that
Pallas never writes back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tiles BLOCK_M x BLOCK_N, K in
# CHUNK-wide sub-tiles inside the kernel. Whole K panels live in VMEM, so tiles are moderate.
BLOCK_M = 512
BLOCK_N = 512
CHUNK = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def panel_kernel(x_ref, y_ref, o_ref, *, chunk, n_chunks):
    # x_ref: [bm, Kp], y_ref: [Kp, bn], o_ref: [bm, bn] float32
    o_ref[...] = jnp.zeros_like(o_ref)

    @pl.loop(0, n_chunks)
    def _chunk(c):
        start = pl.multiple_of(c * chunk, chunk)
        o_ref[...] += jnp.dot(x_ref[:, pl.ds(start, chunk)], y_ref[pl.ds(start, chunk), :],
                              preferred_element_type=jnp.float32)


def _vmem_limit(bm, bn, kp, chunk, itemsize):
    """Double-buffered panels and f32 output tile, the f32 product and chunk copies, plus
    headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * kp + kp * bn) * itemsize + 2 * bm * bn * 4 + bm * bn * 4
            + (bm + bn) * chunk * itemsize)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _matmul_f32acc(x, y, *, bm, bn, chunk):
    m, k = x.shape
    n = y.shape[1]
    kp = _round_up(k, chunk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        functools.partial(panel_kernel, chunk=chunk, n_chunks=kp // chunk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),   # x row panel, all of K
            pl.BlockSpec((kp, bn), lambda i, j: (0, j)),   # y column panel, all of K
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(bm, bn, kp, chunk, x.dtype.itemsize)),
    )(xp, yp)


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    chunk = min(CHUNK, _round_up(k, 128))
    return _matmul_f32acc(x, y, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), chunk=chunk)
