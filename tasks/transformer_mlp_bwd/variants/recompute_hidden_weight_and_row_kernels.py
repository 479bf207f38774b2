"""Backward of the pre-norm MLP block with the hidden activations recomputed, never stored.

With r = rsqrt(mean(x^2) + eps), xn = x * r, u = xn * g, h = u @ w1, a = gelu(h):
    dw2 = a^T @ dy        da = dy @ w2^T        dh = da * gelu'(h)
    dw1 = u^T @ dh        du = dh @ w1^T        dg = sum_rows(du * xn)
    dx  = dy + r * (du * g - xn * mean(du * g * xn))

Two independent pallas_calls, both reading only x, g, w1, w2 and dy (no [M, F] tensor ever goes
through HBM):
1. Weight-gradient kernel, grid (hidden tiles j, row tiles i), rows innermost and "arbitrary":
   per step it normalises its [bm, D] rows, recomputes h, a and dh for hidden tile j, and adds
   u^T @ dh into the dw1[:, j] block and a^T @ dy into the dw2[j, :] block. Both outputs are
   float32 and accumulate in place in their resident output blocks (their index ignores i);
   the wrapper casts them to the weights' dtypes.
2. Input-gradient kernel, grid (row tiles i, hidden tiles j), both "arbitrary": recomputes h
   and dh again, accumulates du = dh @ w1^T in an f32 VMEM scratch [bm, D], and at the last
   hidden tile finishes the rms-norm backward into dx and adds du * xn, summed over the tile's
   rows, into a single [1, D] float32 dg block that stays resident across the WHOLE grid
   (hence no parallel axis): dg leaves the kernel fully reduced.
The forward matmul h and da are computed twice (once per kernel): more FLOPs in exchange for
no intermediate HBM traffic.

Edges: zero padding in the wrapper: D to a multiple of 128 (means over the true D; padded g,
w1 rows, w2 columns, dy columns are zero), F to the hidden block (zero w1 columns / w2 rows
give h = 0, a = 0, da = 0), M to the row block (x = 0 and dy = 0 rows give u = a = dh = 0, so
they add nothing to any weight gradient or to dg). The padding is sliced off.
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

BLOCK_M = 512
BLOCK_F = 256

_MiB = 1024 * 1024
_NN = (((1,), (0,)), ((), ()))
_NT = (((1,), (1,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))


def _round_up(x, m):
    return (x + m - 1) // m * m


def _limit(need):
    return min(100 * _MiB, max(32 * _MiB, 2 * need))


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _hidden(x_ref, g_ref, w1_ref, w2_ref, dy_ref, d_true):
    """Recompute (r, xn, u, a, dh) for one row tile and one hidden tile."""
    x = x_ref[...].astype(jnp.float32)
    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
    xn = x * r
    u = (xn * g_ref[...].astype(jnp.float32)).astype(w1_ref.dtype)
    h = _dot(u, w1_ref[...], _NN)                                          # [bm, bf]
    t = jnp.tanh(_GELU_C * (h + _GELU_K * h * h * h))
    a = 0.5 * h * (1.0 + t)
    gelu_grad = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _GELU_C * (1.0 + 3 * _GELU_K * h * h)
    da = _dot(dy_ref[...], w2_ref[...], _NT)                               # [bm, bf]
    dh = (da * gelu_grad).astype(w1_ref.dtype)
    return r, xn, u, a.astype(w2_ref.dtype), dh


def weight_grad_kernel(x_ref, g_ref, w1_ref, w2_ref, dy_ref, dw1_ref, dw2_ref, *, d_true):
    @pl.when(pl.program_id(1) == 0)
    def _zero():
        dw1_ref[...] = jnp.zeros_like(dw1_ref)
        dw2_ref[...] = jnp.zeros_like(dw2_ref)

    _, _, u, a, dh = _hidden(x_ref, g_ref, w1_ref, w2_ref, dy_ref, d_true)
    dw1_ref[...] += _dot(u, dh, _TN)                                       # [D, bf]
    dw2_ref[...] += _dot(a, dy_ref[...], _TN)                              # [bf, D]


def input_grad_kernel(x_ref, g_ref, w1_ref, w2_ref, dy_ref, dx_ref, dg_ref, du_acc, *, d_true):
    i = pl.program_id(0)
    j = pl.program_id(1)

    @pl.when((i == 0) & (j == 0))
    def _zero_dg():
        dg_ref[...] = jnp.zeros_like(dg_ref)

    @pl.when(j == 0)
    def _zero_du():
        du_acc[...] = jnp.zeros_like(du_acc)

    r, xn, _, _, dh = _hidden(x_ref, g_ref, w1_ref, w2_ref, dy_ref, d_true)
    du_acc[...] += _dot(dh, w1_ref[...], _NT)                              # [bm, D]

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        du = du_acc[...]
        dxn = du * g_ref[...].astype(jnp.float32)
        proj = jnp.sum(dxn * xn, axis=-1, keepdims=True) * (1.0 / d_true)
        dx_ref[...] = (dy_ref[...].astype(jnp.float32) + r * (dxn - xn * proj)).astype(dx_ref.dtype)
        dg_ref[...] += jnp.sum(du * xn, axis=0, keepdims=True)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _mlp_bwd(x, g, w1, w2, dy, *, bm, bf):
    m, d = x.shape
    f = w1.shape[1]
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    dy_p = jnp.pad(dy, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    isz = x.dtype.itemsize
    nm, nf = mp // bm, fp // bf
    temps = 4 * bm * dp * 4 + 6 * bm * bf * 4

    need_w = 2 * (2 * bm * dp * isz + 2 * dp * bf * isz) + 2 * 2 * dp * bf * 4 + temps
    dw1, dw2 = pl.pallas_call(
        functools.partial(weight_grad_kernel, d_true=d),
        grid=(nf, nm),
        in_specs=[pl.BlockSpec((bm, dp), lambda j, i: (i, 0)),
                  pl.BlockSpec((1, dp), lambda j, i: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda j, i: (0, j)),
                  pl.BlockSpec((bf, dp), lambda j, i: (j, 0)),
                  pl.BlockSpec((bm, dp), lambda j, i: (i, 0))],
        out_specs=[pl.BlockSpec((dp, bf), lambda j, i: (0, j)),
                   pl.BlockSpec((bf, dp), lambda j, i: (j, 0))],
        out_shape=[jax.ShapeDtypeStruct((dp, fp), jnp.float32),
                   jax.ShapeDtypeStruct((fp, dp), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=_limit(need_w)),
    )(x_p, g_p, w1_p, w2_p, dy_p)

    need_r = 2 * (3 * bm * dp * isz + 2 * dp * bf * isz) + bm * dp * 4 + 2 * dp * 4 + temps
    dx, dg = pl.pallas_call(
        functools.partial(input_grad_kernel, d_true=d),
        grid=(nm, nf),
        in_specs=[pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((bf, dp), lambda i, j: (j, 0)),
                  pl.BlockSpec((bm, dp), lambda i, j: (i, 0))],
        out_specs=[pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
                   pl.BlockSpec((1, dp), lambda i, j: (0, 0))],
        out_shape=[jax.ShapeDtypeStruct((mp, dp), x.dtype),
                   jax.ShapeDtypeStruct((1, dp), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((bm, dp), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary", "arbitrary"), vmem_limit_bytes=_limit(need_r)),
    )(x_p, g_p, w1_p, w2_p, dy_p)

    return (dx[:m, :d], dg[0, :d].astype(g.dtype),
            dw1[:d, :f].astype(w1.dtype), dw2[:f, :d].astype(w2.dtype))


def kernel(x, g, w1, w2, dy):
    m, d = x.shape
    f = w1.shape[1]
    if (g.shape != (d,) or w1.shape != (d, f) or w2.shape != (f, d) or dy.shape != x.shape):
        raise ValueError(f"shape mismatch: {x.shape=} {g.shape=} {w1.shape=} {w2.shape=} "
                         f"{dy.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm = min(BLOCK_M, _round_up(m, sublane))
    bf = min(BLOCK_F, _round_up(f, 128))
    return _mlp_bwd(x, g, w1, w2, dy, bm=bm, bf=bf)
