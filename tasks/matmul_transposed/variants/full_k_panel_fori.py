"""x[M, K] @ w[N, K]^T with K walked inside each grid step over whole-K row panels.

Grid (M tiles, N tiles), both "parallel": there is no K grid axis. Each step receives a
[bm, Kp] row panel of x and a [bn, Kp] row panel of w (Kp = K rounded up to CHUNK; both are
contiguous row ranges of the stored arrays) and a `lax.fori_loop` walks K in CHUNK-lane
sub-tiles, contracting the minor dims of both sub-tiles with `lax.dot_general` (no transpose
anywhere) and carrying the f32 accumulator as a loop value. The output tile is stored once at
the end of the step: no VMEM scratch, no `pl.when` phases.

Ragged edges: K is zero-padded on both operands to whole chunks (exact); M and N use
`pl.cdiv` grids, and garbage rows of edge panels only reach outputs never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tiles BLOCK_M x BLOCK_N, K in
# CHUNK-lane sub-tiles inside the kernel. Blocks never exceed the dims.
BLOCK_M = 512
BLOCK_N = 512
CHUNK = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def nt_panel_kernel(x_ref, w_ref, o_ref, *, chunk, n_chunks):
    # x_ref: [bm, Kp], w_ref: [bn, Kp], o_ref: [bm, bn]
    def body(c, acc):
        start = pl.multiple_of(c * chunk, chunk)
        x = x_ref[:, pl.ds(start, chunk)]                  # [bm, chunk]
        w = w_ref[:, pl.ds(start, chunk)]                  # [bn, chunk]
        return acc + lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, n_chunks, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _vmem_limit(bm, bn, kp, chunk, itemsize):
    """Double-buffered panels and output tile, the f32 carry and product, chunk copies,
    plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * kp + bn * kp + bm * bn) * itemsize + 3 * bm * bn * 4
            + (bm + bn) * chunk * itemsize)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _matmul_nt(x, w, *, bm, bn, chunk):
    m, k = x.shape
    n = w.shape[0]
    kp = _round_up(k, chunk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, 0), (0, kp - k)))
    return pl.pallas_call(
        functools.partial(nt_panel_kernel, chunk=chunk, n_chunks=kp // chunk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),   # x rows, all of K
            pl.BlockSpec((bn, kp), lambda i, j: (j, 0)),   # w rows, all of K
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(bm, bn, kp, chunk, x.dtype.itemsize)),
    )(xp, wp)


def kernel(x, w):
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"contracted dims differ: {x.shape=} {w.shape=}")
    chunk = min(CHUNK, _round_up(k, 128))
    return _matmul_nt(x, w, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), chunk=chunk)
