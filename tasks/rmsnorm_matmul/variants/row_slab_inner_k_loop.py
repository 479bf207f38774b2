"""Fused RMS norm + matmul with a 2-D grid and the D reduction as a loop inside the kernel.

Grid (M tiles, N tiles), both "parallel". Each step gets a whole (padded) row tile of x
[bm, Dp] and a whole-D column slab of w [Dp, bn], so it owns one finished output tile:
  1. a first loop over D chunks sums x^2 per row and gives inv_rms = rsqrt(sum / D + eps);
  2. a second lax.fori_loop over D chunks normalises each chunk *before* its dot,
     (x_c * inv_rms * scale_c) in w's dtype @ w_c, accumulating the f32 [bm, bn] product in
     the loop carry (no VMEM scratch, no grid reduction axis, no pl.when phases).
The output tile is written once at the end of the step.

Ragged edges: the wrapper zero-pads M, D and N to the blocks (D to a multiple of the chunk).
Padded D columns are zero, so they add nothing to the sum of squares (divided by the true D)
and meet zero rows of the padded w; padded rows normalise to zero; padded output rows and
columns are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6

BLOCK_M = 256
BLOCK_N = 256
CHUNK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def rmsnorm_matmul_kernel(x_ref, scale_ref, w_ref, o_ref, *, d_true, chunk):
    bm = x_ref.shape[0]
    bn = w_ref.shape[1]
    num_chunks = x_ref.shape[1] // chunk

    def sum_squares(c, ss):
        xc = x_ref[:, pl.ds(pl.multiple_of(c * chunk, chunk), chunk)].astype(jnp.float32)
        return ss + jnp.sum(xc * xc, axis=-1, keepdims=True)

    ss = lax.fori_loop(0, num_chunks, sum_squares, jnp.zeros((bm, 1), jnp.float32))
    inv_rms = lax.rsqrt(ss * (1.0 / d_true) + EPS)                           # [bm, 1]

    def matmul_chunk(c, acc):
        cols = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
        xc = x_ref[:, cols].astype(jnp.float32)
        xn = (xc * inv_rms * scale_ref[:, cols].astype(jnp.float32)).astype(w_ref.dtype)
        return acc + jnp.dot(xn, w_ref[cols, :], preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, num_chunks, matmul_chunk, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "chunk"))
def _rmsnorm_matmul(x, scale, w, *, bm, bn, chunk):
    m, d = x.shape
    n = w.shape[1]
    mp, dp, np_ = _round_up(m, bm), _round_up(d, chunk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    sp = jnp.pad(scale, (0, dp - d)).reshape(1, dp)
    wp = jnp.pad(w, ((0, dp - d), (0, np_ - n)))
    itemsize = x.dtype.itemsize
    need = (2 * (bm * dp + dp + dp * bn + bm * bn) * itemsize   # double-buffered blocks
            + 3 * bm * chunk * 4 + 2 * bm * bn * 4)             # chunk temporaries, carry
    out = pl.pallas_call(
        functools.partial(rmsnorm_matmul_kernel, d_true=d, chunk=chunk),
        grid=(mp // bm, np_ // bn),
        in_specs=[pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, need + need // 4)))),
    )(xp, sp, wp)
    return out[:m, :n]


def kernel(x, scale, w):
    m, d = x.shape
    d2, n = w.shape
    if d != d2 or scale.shape != (d,):
        raise ValueError(f"shape mismatch: {x.shape=} {scale.shape=} {w.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    return _rmsnorm_matmul(x, scale, w, bm=min(BLOCK_M, _round_up(m, sublane)),
                           bn=min(BLOCK_N, _round_up(n, 128)),
                           chunk=min(CHUNK_K, _round_up(d, 128)))
