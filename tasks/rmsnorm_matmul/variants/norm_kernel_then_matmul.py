"""(rms_norm(x) * scale) @ w as two pallas_calls: a row-norm kernel, then a tiled matmul.

1. norm kernel, grid (M tiles,) "parallel": the x block is a whole row tile [bm, D], so the
   mean square is exact in one step; it writes xn = x * rsqrt(mean(x^2) + eps) * scale (in w's
   dtype, what the MXU takes) into a [Mp, Dp] array already padded for the matmul's blocks:
   columns D..Dp are written as zeros by the kernel itself.
2. matmul kernel, grid (M tiles, N tiles, D tiles): a plain tiled xn @ w with an f32 VMEM
   accumulator, cast and stored after the last D step.
The normalised activations make one HBM round trip (written once, read once per N tile).

Ragged edges: the wrapper zero-pads x's rows to Mp (a zero row normalises to zeros: eps keeps
rsqrt finite) but not its columns: the x block is exactly D wide, so the mean uses the true D,
and the kernel zero-fills xn's padded columns. w is zero-padded to [Dp, Np] in the wrapper;
padded output rows and columns are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6

NORM_BLOCK_M = 256
BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 512
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def norm_kernel(x_ref, scale_ref, xn_ref):
    d = x_ref.shape[1]
    x = x_ref[...].astype(jnp.float32)                                      # [bm, D]
    inv_rms = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    xn = x * inv_rms * scale_ref[...].astype(jnp.float32)
    if xn_ref.shape[1] > d:   # static: zero the padded K columns
        xn_ref[:, d:] = jnp.zeros((xn.shape[0], xn_ref.shape[1] - d), xn_ref.dtype)
    xn_ref[:, :d] = xn.astype(xn_ref.dtype)


def matmul_kernel(xn_ref, w_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(xn_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "bm_norm"))
def _rmsnorm_matmul(x, scale, w, *, bm, bn, bk, bm_norm):
    m, d = x.shape
    n = w.shape[1]
    mp, dp, np_ = _round_up(m, bm), _round_up(d, bk), _round_up(n, bn)
    itemsize = x.dtype.itemsize
    dl = _round_up(d, 128)
    norm_need = 2 * bm_norm * (dl + dp) * itemsize + 3 * bm_norm * dl * 4
    xn = pl.pallas_call(
        norm_kernel,
        grid=(mp // bm_norm,),
        in_specs=[pl.BlockSpec((bm_norm, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bm_norm, dp), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), w.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, norm_need + norm_need // 4)))),
    )(jnp.pad(x, ((0, mp - m), (0, 0))), scale.reshape(1, d))

    wp = jnp.pad(w, ((0, dp - d), (0, np_ - n)))
    mm_need = 2 * (bm * bk + bk * bn + bm * bn) * itemsize + 2 * bm * bn * 4
    out = pl.pallas_call(
        matmul_kernel,
        grid=(mp // bm, np_ // bn, dp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, mm_need + mm_need // 4)))),
    )(xn, wp)
    return out[:m, :n]


def kernel(x, scale, w):
    m, d = x.shape
    d2, n = w.shape
    if d != d2 or scale.shape != (d,):
        raise ValueError(f"shape mismatch: {x.shape=} {scale.shape=} {w.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm = min(BLOCK_M, _round_up(m, sublane))
    bm_norm = bm if bm % NORM_BLOCK_M else NORM_BLOCK_M   # divides bm
    return _rmsnorm_matmul(x, scale, w, bm=bm, bn=min(BLOCK_N, _round_up(n, 128)),
                           bk=min(BLOCK_K, _round_up(d, 128)), bm_norm=bm_norm)
