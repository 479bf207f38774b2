"""Fused RMS norm + matmul that normalises each row tile once, into VMEM scratch.

Grid (M tiles "parallel", N tiles "arbitrary", D tiles "arbitrary"). The x block is a whole
(padded) row tile [bm, Dp] whose index depends only on the M tile, so it is fetched once per
row tile. At the first step of a row tile (j == 0 and k == 0) the kernel computes the rms scale
rsqrt(sum(x^2) / D + eps) from the whole rows and writes the normalised, scaled rows
x * inv_rms * scale, in w's dtype, into a [Dp / bk, bm, bk] scratch (one slice per D tile).
Every later (j, k) step only does xn[k] @ w_tile into an f32 accumulator, stored after the last
D step. The N and D axes are "arbitrary" because the scratch written at j == 0 is read by every
later N tile of the same row tile.

Ragged edges: the wrapper zero-pads M, D and N to the blocks. Padded D columns are zero, so
they add nothing to the sum of squares, which is divided by the true D; they also meet zero
rows of the padded w. Padded rows (all zero) normalise to zero; padded output rows and columns
are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6

BLOCK_M = 256
BLOCK_N = 1024
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def kernel_body(x_ref, scale_ref, w_ref, o_ref, xn_ref, acc_ref, *, d_true):
    j, kk = pl.program_id(1), pl.program_id(2)
    nk, _, bk = xn_ref.shape

    @pl.when((j == 0) & (kk == 0))
    def _normalise_rows():
        x = x_ref[...].astype(jnp.float32)                                   # [bm, Dp]
        inv_rms = jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
        xn = x * inv_rms * scale_ref[...].astype(jnp.float32)
        for c in range(nk):   # static: one scratch slice per D tile
            xn_ref[c] = xn[:, c * bk:(c + 1) * bk].astype(xn_ref.dtype)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(xn_ref[kk], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kk == nk - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _rmsnorm_matmul(x, scale, w, *, bm, bn, bk):
    m, d = x.shape
    n = w.shape[1]
    mp, dp, np_ = _round_up(m, bm), _round_up(d, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    sp = jnp.pad(scale, (0, dp - d)).reshape(1, dp)
    wp = jnp.pad(w, ((0, dp - d), (0, np_ - n)))
    itemsize = x.dtype.itemsize
    need = (2 * (bm * dp + dp + bk * bn + bm * bn) * itemsize   # x, scale, w, out blocks
            + bm * dp * itemsize + bm * bn * 4                  # xn scratch, accumulator
            + 3 * bm * dp * 4 + bm * bn * 4)                    # f32 temporaries
    out = pl.pallas_call(
        functools.partial(kernel_body, d_true=d),
        grid=(mp // bm, np_ // bn, dp // bk),
        in_specs=[pl.BlockSpec((bm, dp), lambda i, j, kk: (i, 0)),
                  pl.BlockSpec((1, dp), lambda i, j, kk: (0, 0)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((dp // bk, bm, bk), w.dtype),   # normalised rows
                        pltpu.VMEM((bm, bn), jnp.float32)],        # accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
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
                           bk=min(BLOCK_K, _round_up(d, 128)))
