"""Batched matmul with K walked inside each grid step by a fori_loop over whole-K panels.

Grid (B, M tiles, N tiles), all "parallel": there is no K grid axis. The batch dim is squeezed
out of the blocks; each step receives a [bm, Kp] row panel of a and a [Kp, bn] column panel of
b for one batch entry (Kp = K rounded up to CHUNK) and a `lax.fori_loop` walks K in
CHUNK-wide sub-tiles, carrying the f32 accumulator as a loop value. The output tile is
produced and stored once per step: no VMEM scratch and no `pl.when` init / store phases.

Ragged edges: K is zero-padded to whole chunks (zeros add nothing); M and N use `pl.cdiv`
grids and their garbage rows / columns only reach outputs never written back. The panels
must fit VMEM whole (double-buffered), so output tiles are moderate.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tiles BLOCK_M x BLOCK_N, K in
# CHUNK-wide MXU steps inside the kernel. Blocks never exceed the dims.
BLOCK_M = 512
BLOCK_N = 512
CHUNK = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def bmm_panel_kernel(a_ref, b_ref, o_ref, *, chunk, n_chunks):
    # a_ref: [bm, Kp], b_ref: [Kp, bn], o_ref: [bm, bn] (batch squeezed out)
    def body(c, acc):
        start = pl.multiple_of(c * chunk, chunk)
        return acc + jnp.dot(a_ref[:, pl.ds(start, chunk)], b_ref[pl.ds(start, chunk), :],
                             preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, n_chunks, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _vmem_limit(bm, bn, kp, chunk, itemsize):
    """Double-buffered panels and output tile, the f32 carry and product, chunk copies,
    plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * kp + kp * bn + bm * bn) * itemsize + 3 * bm * bn * 4
            + (bm + bn) * chunk * itemsize)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _bmm(a, b, *, bm, bn, chunk):
    batch, m, k = a.shape
    n = b.shape[2]
    kp = _round_up(k, chunk)
    ap = jnp.pad(a, ((0, 0), (0, 0), (0, kp - k)))
    bp = jnp.pad(b, ((0, 0), (0, kp - k), (0, 0)))
    return pl.pallas_call(
        functools.partial(bmm_panel_kernel, chunk=chunk, n_chunks=kp // chunk),
        grid=(batch, pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((pl.Squeezed(), bm, kp), lambda g, i, j: (g, i, 0)),
            pl.BlockSpec((pl.Squeezed(), kp, bn), lambda g, i, j: (g, 0, j)),
        ],
        out_specs=pl.BlockSpec((pl.Squeezed(), bm, bn), lambda g, i, j: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, m, n), a.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(bm, bn, kp, chunk, a.dtype.itemsize)),
    )(ap, bp)


def kernel(a, b):
    batch, m, k = a.shape
    batch2, k2, n = b.shape
    if batch != batch2 or k != k2:
        raise ValueError(f"shape mismatch: {a.shape=} {b.shape=}")
    chunk = min(CHUNK, _round_up(k, 128))
    return _bmm(a, b, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N), chunk=chunk)
