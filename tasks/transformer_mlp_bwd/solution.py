"""Backward of the pre-norm MLP block y = x + gelu_tanh(rms_norm(x) * g @ w1) @ w2.

With r = rsqrt(mean(x^2) + eps), xn = x * r, u = xn * g, h = u @ w1, a = gelu(h):
    dw2 = a^T @ dy        da = dy @ w2^T        dh = da * gelu'(h)
    dw1 = u^T @ dh        du = dh @ w1^T        dg = sum_rows(du * xn)
    dx  = dy + r * (du * g - xn * mean(du * g * xn))

Three pallas_calls:
1. A row kernel, grid (row tiles, hidden tiles), hidden axis "arbitrary". At a row tile's first
   hidden step it normalises the rows and writes u (kept resident as an output block). Each
   hidden step recomputes h = u @ w1[:, f], writes a and dh for that [bm, bf] slab, and adds
   dh @ w1[:, f]^T into a float32 du accumulator in VMEM. At the last hidden step it finishes
   the rms-norm backward (which needs whole rows) into dx, and writes the tile's partial dg.
2. and 3. dw1 = u^T @ dh and dw2 = a^T @ dy: a tiled matmul that contracts the row axis of both
   operands (transposed-lhs on the MXU), float32 accumulator over row blocks (the output
   block itself when the weights are float32).
The per-tile dg partials ([row tiles, D], tiny) are summed in the wrapper.

Padding: D to a multiple of 128 (means divide by the true D; padded g, w1 rows, w2 columns and
dy columns are zero), F to the hidden block (padded w1 columns and w2 rows are zero, so a = 0
and dh = 0 there), M to the row block (padded rows have x = 0 and dy = 0, so they add nothing to
any weight gradient). Float32 operands use full-precision matmuls.

Block sizes are module-level knobs (python -m evaluator tune searches them). The row kernel
streams w1 and w2 once per row tile, so its row block is tall (BLOCK_M = 512: 8 weight passes
at the bench size, under its compute time); the weight-gradient matmuls use large output tiles
(BLOCK_W: at the bench size each operand moves at most 4 times). vmem_limit_bytes is raised
to twice the blocks' bytes: libtpu's float32 temporaries need about as much again.
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

# Block sizes (python -m evaluator tune searches these).
BLOCK_M = 512   # rows per step of the row kernel
BLOCK_F = 512   # hidden units per step of the row kernel
BLOCK_W = 2048  # output tile (both dims, at most) of the weight-gradient matmuls
BLOCK_R = 512   # rows contracted per step of the weight-gradient matmuls

_MiB = 1024 * 1024
_NN = (((1,), (0,)), ((), ()))   # a @ b
_NT = (((1,), (1,)), ((), ()))   # a @ b^T
_TN = (((0,), (0,)), ((), ()))   # a^T @ b


def _round_up(x, m):
    return (x + m - 1) // m * m


def _limit(need):
    """vmem_limit_bytes for blocks and scratch of `need` bytes, with as much again for the
    float32 temporaries (libtpu needs ~4 [bm, D] ones in the row kernel)."""
    return min(100 * _MiB, max(32 * _MiB, 2 * need))


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _norm(x, d_true):
    """(r, xn) of float32 rows x, with the mean over the true (unpadded) width."""
    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
    return r, x * r


def rows_kernel(x_ref, g_ref, w1_ref, w2_ref, dy_ref,
                u_ref, a_ref, dh_ref, dx_ref, dg_ref, du_acc, *, d_true):
    f = pl.program_id(1)
    g = g_ref[...].astype(jnp.float32)  # [1, D]

    @pl.when(f == 0)
    def _start_rows():
        _, xn = _norm(x_ref[...].astype(jnp.float32), d_true)
        u_ref[...] = (xn * g).astype(u_ref.dtype)  # resident output block: reused below
        du_acc[...] = jnp.zeros_like(du_acc)

    h = _dot(u_ref[...], w1_ref[...], _NN)                      # [bm, bf]
    t = jnp.tanh(_GELU_C * (h + _GELU_K * h * h * h))
    a_ref[...] = (0.5 * h * (1.0 + t)).astype(a_ref.dtype)
    gelu_grad = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _GELU_C * (1.0 + 3 * _GELU_K * h * h)
    da = _dot(dy_ref[...], w2_ref[...], _NT)                    # [bm, bf]
    dh = (da * gelu_grad).astype(dh_ref.dtype)
    dh_ref[...] = dh
    du_acc[...] += _dot(dh, w1_ref[...], _NT)                   # [bm, D]

    @pl.when(f == pl.num_programs(1) - 1)
    def _finish_rows():
        r, xn = _norm(x_ref[...].astype(jnp.float32), d_true)
        du = du_acc[...]
        dxn = du * g
        proj = jnp.sum(dxn * xn, axis=-1, keepdims=True) * (1.0 / d_true)
        dx = dy_ref[...].astype(jnp.float32) + r * (dxn - xn * proj)
        dx_ref[...] = dx.astype(dx_ref.dtype)
        dg_ref[...] = jnp.sum(du * xn, axis=0, keepdims=True)  # this tile's share of dg


def tn_matmul_kernel(lhs_ref, rhs_ref, o_ref, *scratch):
    acc_ref = scratch[0] if scratch else o_ref  # float32 output: accumulate in place
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += _dot(lhs_ref[...], rhs_ref[...], _TN)

    if scratch:
        @pl.when(k == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _tile(n, preferred, align):
    """n itself (a full-dim block) up to `preferred`, else the largest multiple of `align` at
    most `preferred` that divides n (n is a multiple of `align`)."""
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _tn_matmul(lhs, rhs, out_dtype, sublane):
    """lhs[K, P]^T @ rhs[K, Q] -> [P, Q]; P and Q multiples of 128, K of the sublane tile."""
    k, p = lhs.shape
    q = rhs.shape[1]
    bp, bq = _tile(p, BLOCK_W, 128), _tile(q, BLOCK_W, 128)
    bk = _tile(k, BLOCK_R, sublane)
    itemsize = lhs.dtype.itemsize
    separate_acc = jnp.dtype(out_dtype) != jnp.float32
    need = (2 * (bk * bp + bk * bq + bp * bq) * itemsize   # lhs, rhs, out blocks
            + (bp * bq * 4 if separate_acc else 0))       # f32 accumulator
    return pl.pallas_call(
        tn_matmul_kernel,
        grid=(p // bp, q // bq, k // bk),
        in_specs=[pl.BlockSpec((bk, bp), lambda i, j, kk: (kk, i)),
                  pl.BlockSpec((bk, bq), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bp, bq), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((p, q), out_dtype),
        scratch_shapes=[pltpu.VMEM((bp, bq), jnp.float32)] if separate_acc else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_limit(need)),
    )(lhs, rhs)


def _rows_vmem(bm, bf, dp, itemsize):
    return (2 * 4 * bm * dp * itemsize      # x, dy in; u, dx out (double-buffered)
            + 2 * 2 * dp * bf * itemsize    # w1, w2 blocks
            + 2 * 2 * bm * bf * itemsize    # a, dh out
            + 2 * 8 * dp * 4                # dg partial (padded to 8 rows)
            + bm * dp * 4)                  # du accumulator


@functools.partial(jax.jit, static_argnames=("bm", "bf", "sublane"))
def _mlp_bwd(x, g, w1, w2, dy, *, bm, bf, sublane):
    m, d = x.shape
    f = w1.shape[1]
    dtype = x.dtype
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    dy_p = jnp.pad(dy, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    n_rows = mp // bm

    row_d = pl.BlockSpec((bm, dp), lambda i, j: (i, 0))
    row_f = pl.BlockSpec((bm, bf), lambda i, j: (i, j))
    u, a, dh, dx, dg_parts = pl.pallas_call(
        functools.partial(rows_kernel, d_true=d),
        grid=(n_rows, fp // bf),
        in_specs=[row_d,
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((bf, dp), lambda i, j: (j, 0)),
                  row_d],
        out_specs=[row_d, row_f, row_f, row_d,
                   pl.BlockSpec((None, 1, dp), lambda i, j: (i, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((mp, dp), dtype),          # u
                   jax.ShapeDtypeStruct((mp, fp), dtype),          # a
                   jax.ShapeDtypeStruct((mp, fp), dtype),          # dh
                   jax.ShapeDtypeStruct((mp, dp), dtype),          # dx
                   jax.ShapeDtypeStruct((n_rows, 1, dp), jnp.float32)],  # dg per row tile
        scratch_shapes=[pltpu.VMEM((bm, dp), jnp.float32)],        # du accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_limit(_rows_vmem(bm, bf, dp, jnp.dtype(dtype).itemsize))),
    )(x_p, g_p, w1_p, w2_p, dy_p)

    dw1 = _tn_matmul(u, dh, w1.dtype, sublane)    # [dp, fp]
    dw2 = _tn_matmul(a, dy_p, w2.dtype, sublane)  # [fp, dp]
    dg = jnp.sum(dg_parts[:, 0, :d], axis=0).astype(g.dtype)
    return dx[:m, :d], dg, dw1[:d, :f], dw2[:f, :d]


def kernel(x, g, w1, w2, dy):
    m, d = x.shape
    f = w1.shape[1]
    if (g.shape != (d,) or w1.shape != (d, f) or w2.shape != (f, d) or dy.shape != x.shape):
        raise ValueError(f"shape mismatch: {x.shape=} {g.shape=} {w1.shape=} {w2.shape=} "
                         f"{dy.shape=}")
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(BLOCK_M, _round_up(m, sublane))
    bf = min(BLOCK_F, _round_up(f, 128))
    return _mlp_bwd(x, g, w1, w2, dy, bm=bm, bf=bf, sublane=sublane)
