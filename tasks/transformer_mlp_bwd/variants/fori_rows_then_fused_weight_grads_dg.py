"""Backward of the pre-norm MLP block in two pallas_calls: a row kernel that loops over hidden
chunks with lax.fori_loop, then ONE kernel for dw1, dw2 and dg together.

With r = rsqrt(mean(x^2) + eps), xn = x * r, u = xn * g, h = u @ w1, a = gelu(h):
    dw2 = a^T @ dy        da = dy @ w2^T        dh = da * gelu'(h)
    dw1 = u^T @ dh        du = dh @ w1^T        dg = sum_rows(du * xn)
    dx  = dy + r * (du * g - xn * mean(du * g * xn))
dg is rewritten so that it needs no du:  with P = xn^T @ dh  ([D, F]),
    dw1[d, f] = g[d] * P[d, f]      and      dg[d] = sum_f w1[d, f] * P[d, f].

1. Row kernel, grid (row tiles, hidden tiles), hidden axis "arbitrary". Each grid step gets a
   [D, BF] block of w1 and [BF, D] of w2, normalises its rows, and runs a `lax.fori_loop` over
   CHUNK-wide sub-slabs: h, a, da, dh for the sub-slab, a and dh written into the step's
   [bm, BF] output blocks at a dynamic lane offset, and dh @ w1[:, c]^T added into an f32 VMEM
   scratch du accumulator. The last hidden step finishes the rms-norm backward into dx.
2. Weight kernel, grid (hidden tiles j, row chunks k), rows innermost and "arbitrary": it
   re-normalises its x rows (cheaper than storing xn) and adds xn^T @ dh[:, j] into an f32 P
   scratch [D, bf] and a^T @ dy into an f32 dw2 scratch [bf, D]. At the last row chunk it
   writes dw1[:, j] = g * P, dw2[j, :], and dg's share of hidden tile j, sum_f(w1[:, j] * P),
   as a [D, 1] column. The wrapper sums the (few, tiny) per-hidden-tile dg columns.

Edges: zero padding in the wrapper: D to a multiple of 128 (means over the true D; padded g,
w1 rows, w2 columns, dy columns are zero), F to the hidden block (a = 0 and dh = 0 there), M to
the row block (x = 0, dy = 0 rows give xn = a = dh = 0: no weight-gradient or dg
contribution). The padding is sliced off.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715

BLOCK_M = 512   # rows per step of the row kernel
BLOCK_F = 512   # hidden units per grid step (both kernels)
CHUNK = 128     # hidden units per fori_loop iteration of the row kernel
BLOCK_R = 256   # rows contracted per step of the weight kernel

_MiB = 1024 * 1024
_NN = (((1,), (0,)), ((), ()))
_NT = (((1,), (1,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))


def _round_up(x, m):
    return (x + m - 1) // m * m


def _tile(n, preferred, align):
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _limit(need):
    return min(100 * _MiB, max(32 * _MiB, 2 * need))


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _norm(x, d_true):
    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
    return r, x * r


def rows_kernel(x_ref, g_ref, w1_ref, w2_ref, dy_ref, a_ref, dh_ref, dx_ref, du_acc,
                *, d_true, chunk, n_chunks):
    j = pl.program_id(1)
    g = g_ref[...].astype(jnp.float32)
    r, xn = _norm(x_ref[...].astype(jnp.float32), d_true)

    @pl.when(j == 0)
    def _zero():
        du_acc[...] = jnp.zeros_like(du_acc)

    u = (xn * g).astype(w1_ref.dtype)
    dy = dy_ref[...]

    def body(c, carry):
        cols = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
        w1c = w1_ref[:, cols]                                              # [D, chunk]
        h = _dot(u, w1c, _NN)                                              # [bm, chunk]
        t = jnp.tanh(_GELU_C * (h + _GELU_K * h * h * h))
        a_ref[:, cols] = (0.5 * h * (1.0 + t)).astype(a_ref.dtype)
        gelu_grad = (0.5 * (1.0 + t)
                     + 0.5 * h * (1.0 - t * t) * _GELU_C * (1.0 + 3 * _GELU_K * h * h))
        da = _dot(dy, w2_ref[cols, :], _NT)                                # [bm, chunk]
        dh = (da * gelu_grad).astype(dh_ref.dtype)
        dh_ref[:, cols] = dh
        du_acc[...] += _dot(dh, w1c, _NT)                                  # [bm, D]
        return carry

    lax.fori_loop(0, n_chunks, body, 0)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        dxn = du_acc[...] * g
        proj = jnp.sum(dxn * xn, axis=-1, keepdims=True) * (1.0 / d_true)
        dx_ref[...] = (dy.astype(jnp.float32) + r * (dxn - xn * proj)).astype(dx_ref.dtype)


def weights_kernel(x_ref, gcol_ref, w1_ref, a_ref, dh_ref, dy_ref,
                   dw1_ref, dw2_ref, dg_ref, p_acc, dw2_acc, *, d_true):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _zero():
        p_acc[...] = jnp.zeros_like(p_acc)
        dw2_acc[...] = jnp.zeros_like(dw2_acc)

    _, xn = _norm(x_ref[...].astype(jnp.float32), d_true)
    p_acc[...] += _dot(xn.astype(dh_ref.dtype), dh_ref[...], _TN)          # [D, bf]
    dw2_acc[...] += _dot(a_ref[...], dy_ref[...], _TN)                     # [bf, D]

    @pl.when(k == pl.num_programs(1) - 1)
    def _store():
        p = p_acc[...]
        dw1_ref[...] = (gcol_ref[...].astype(jnp.float32) * p).astype(dw1_ref.dtype)
        dw2_ref[...] = dw2_acc[...].astype(dw2_ref.dtype)
        dg_ref[...] = jnp.sum(w1_ref[...].astype(jnp.float32) * p, axis=1, keepdims=True)


@functools.partial(jax.jit, static_argnames=("bm", "bf", "sublane"))
def _mlp_bwd(x, g, w1, w2, dy, *, bm, bf, sublane):
    m, d = x.shape
    f = w1.shape[1]
    dtype = x.dtype
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    chunk = _tile(bf, CHUNK, 128)
    br = _tile(mp, BLOCK_R, sublane)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    dy_p = jnp.pad(dy, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d))
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    isz = jnp.dtype(dtype).itemsize
    nf = fp // bf

    row_d = pl.BlockSpec((bm, dp), lambda i, j: (i, 0))
    row_f = pl.BlockSpec((bm, bf), lambda i, j: (i, j))
    need_r = (2 * (3 * bm * dp + 2 * dp * bf + 2 * bm * bf) * isz + bm * dp * 4
              + 4 * bm * dp * 4 + 6 * bm * chunk * 4)
    a, dh, dx = pl.pallas_call(
        functools.partial(rows_kernel, d_true=d, chunk=chunk, n_chunks=bf // chunk),
        grid=(mp // bm, nf),
        in_specs=[row_d,
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((bf, dp), lambda i, j: (j, 0)),
                  row_d],
        out_specs=[row_f, row_f, row_d],
        out_shape=[jax.ShapeDtypeStruct((mp, fp), dtype),     # a
                   jax.ShapeDtypeStruct((mp, fp), dtype),     # dh
                   jax.ShapeDtypeStruct((mp, dp), dtype)],    # dx
        scratch_shapes=[pltpu.VMEM((bm, dp), jnp.float32)],   # du accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=_limit(need_r)),
    )(x_p, g_p.reshape(1, dp), w1_p, w2_p, dy_p)

    need_w = (2 * (2 * br * dp + 2 * br * bf + dp * bf) * isz + 2 * 2 * dp * bf * isz
              + 2 * dp * bf * 4 + 2 * br * dp * 4 + 2 * dp * 128 * 4)
    dw1, dw2, dg_parts = pl.pallas_call(
        functools.partial(weights_kernel, d_true=d),
        grid=(nf, mp // br),
        in_specs=[pl.BlockSpec((br, dp), lambda j, k: (k, 0)),     # x
                  pl.BlockSpec((dp, 1), lambda j, k: (0, 0)),      # g as a column
                  pl.BlockSpec((dp, bf), lambda j, k: (0, j)),     # w1
                  pl.BlockSpec((br, bf), lambda j, k: (k, j)),     # a
                  pl.BlockSpec((br, bf), lambda j, k: (k, j)),     # dh
                  pl.BlockSpec((br, dp), lambda j, k: (k, 0))],    # dy
        out_specs=[pl.BlockSpec((dp, bf), lambda j, k: (0, j)),
                   pl.BlockSpec((bf, dp), lambda j, k: (j, 0)),
                   pl.BlockSpec((None, dp, 1), lambda j, k: (j, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((dp, fp), w1.dtype),
                   jax.ShapeDtypeStruct((fp, dp), w2.dtype),
                   jax.ShapeDtypeStruct((nf, dp, 1), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((dp, bf), jnp.float32),   # P = xn^T @ dh
                        pltpu.VMEM((bf, dp), jnp.float32)],  # dw2
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=_limit(need_w)),
    )(x_p, g_p.reshape(dp, 1), w1_p, a, dh, dy_p)

    dg = jnp.sum(dg_parts[:, :d, 0], axis=0).astype(g.dtype)
    return dx[:m, :d], dg, dw1[:d, :f], dw2[:f, :d]


def kernel(x, g, w1, w2, dy):
    m, d = x.shape
    f = w1.shape[1]
    if (g.shape != (d,) or w1.shape != (d, f) or w2.shape != (f, d) or dy.shape != x.shape):
        raise ValueError(f"shape mismatch: {x.shape=} {g.shape=} {w1.shape=} {w2.shape=} "
                         f"{dy.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm = min(BLOCK_M, _round_up(m, sublane))
    bf = min(BLOCK_F, _round_up(f, 128))
    return _mlp_bwd(x, g, w1, w2, dy, bm=bm, bf=bf, sublane=sublane)
