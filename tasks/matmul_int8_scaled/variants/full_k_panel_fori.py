"""int8 x int8 matmul with K walked inside each grid step over whole-K int8 panels.

Grid (M tiles, N tiles), both "parallel": there is no K grid axis. Each step receives a
[bm, Kp] int8 row panel of x and a [Kp, bn] int8 column panel of w (Kp = K rounded up to
CHUNK; int8 panels are small, so the whole K fits VMEM easily) and a `lax.fori_loop` walks K
in CHUNK-wide sub-tiles, adding each int32 MXU product into an int32 VMEM scratch (integer
accumulation is exact, so the order is irrelevant). After the loop, in the same step, the
accumulator is converted to f32, scaled by sx[bm, 1] and sw[1, bn] and stored once: no
`pl.when` phases and no "arbitrary" axis.

Ragged edges: K is zero-padded to whole chunks (zeros are exact in the integer product);
M and N use `pl.cdiv` grids, and the garbage rows / columns of edge panels and scale blocks
only reach outputs never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these): output tiles BLOCK_M x BLOCK_N, K in
# CHUNK-wide sub-tiles inside the kernel. Blocks never exceed the dims.
BLOCK_M = 512
BLOCK_N = 512
CHUNK = 512
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The preferred block, or the whole dim when it is no larger (always legal)."""
    return dim if dim <= preferred else preferred


def int8_panel_kernel(x_ref, sx_ref, w_ref, sw_ref, o_ref, acc_ref, *, chunk, n_chunks):
    # x_ref: [bm, Kp] int8, w_ref: [Kp, bn] int8, acc_ref: [bm, bn] int32
    acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.loop(0, n_chunks)
    def _chunk(c):
        start = pl.multiple_of(c * chunk, chunk)
        acc_ref[...] += jnp.dot(x_ref[:, pl.ds(start, chunk)], w_ref[pl.ds(start, chunk), :],
                                preferred_element_type=jnp.int32)

    acc = acc_ref[...].astype(jnp.float32)
    o_ref[...] = (acc * sx_ref[...].astype(jnp.float32)
                  * sw_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _vmem_limit(bm, bn, kp, chunk, out_itemsize):
    """Double-buffered int8 panels and output block, the int32 accumulator and product, the
    f32 epilogue, chunk copies, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * kp + kp * bn) + 2 * bm * bn * out_itemsize + 3 * bm * bn * 4
            + (bm + bn) * chunk)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _int8_matmul(x, sx, w, sw, *, bm, bn, chunk):
    m, k = x.shape
    n = w.shape[1]
    kp = _round_up(k, chunk)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, 0)))
    return pl.pallas_call(
        functools.partial(int8_panel_kernel, chunk=chunk, n_chunks=kp // chunk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),   # x row panel, all of K
            pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),    # row scales
            pl.BlockSpec((kp, bn), lambda i, j: (0, j)),   # w column panel, all of K
            pl.BlockSpec((1, bn), lambda i, j: (0, j)),    # column scales
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), sx.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(bm, bn, kp, chunk, sx.dtype.itemsize)),
    )(xp, sx.reshape(m, 1), wp, sw.reshape(1, n))


def kernel(x, sx, w, sw):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or sx.shape != (m,) or sw.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {sx.shape=} {w.shape=} {sw.shape=}")
    chunk = min(CHUNK, _round_up(k, 128))
    return _int8_matmul(x, sx, w, sw, bm=_block(m, BLOCK_M), bn=_block(n, BLOCK_N),
                        chunk=chunk)
