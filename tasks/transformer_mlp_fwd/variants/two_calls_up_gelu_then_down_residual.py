"""Pre-norm MLP block as two pallas_calls: normalise + up-projection + gelu, then down + residual.

1. Up kernel, grid (row tiles, hidden tiles), both "parallel": every step recomputes the rms
   statistics of its [bm, D] row block (the block stays in VMEM across the hidden tiles, and
   the norm is O(bm * D) against the O(bm * D * bf) matmul), forms xn * g, multiplies by the
   [D, bf] block of w1 and writes a = gelu_tanh(h) for that [bm, bf] slab to HBM.
2. Down kernel, grid (row tiles, output column tiles, hidden chunks), hidden axis innermost and
   "arbitrary": the accumulator starts at the residual x[i, n] and collects a[i, k] @ w2[k, n].
   A float32 output accumulates in place in its resident output block; other dtypes use an f32
   VMEM scratch that is cast and stored at the last hidden chunk.
No scratch is needed for the norm (no step depends on another's state in kernel 1).

Edges: zero padding in the wrapper: D to a multiple of 128 (the mean of squares divides by the
true D; padded g, w1 rows and w2 columns are zero), F to the hidden block (gelu(0) = 0 meets
zero w2 rows), M to the row block. The padding is sliced off.
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

BLOCK_M = 512
BLOCK_F = 512
BLOCK_N = 1024   # output column tile of the down kernel

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _tile(n, preferred, align):
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _limit(need):
    return min(100 * _MiB, max(32 * _MiB, 2 * need + 4 * _MiB))


def _dot(a, b):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def up_kernel(x_ref, g_ref, w1_ref, a_ref, *, d_true):
    x = x_ref[...].astype(jnp.float32)
    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
    u = (x * r * g_ref[...].astype(jnp.float32)).astype(w1_ref.dtype)
    h = _dot(u, w1_ref[...])                                               # [bm, bf]
    a = 0.5 * h * (1.0 + jnp.tanh(_GELU_C * (h + 0.044715 * h * h * h)))
    a_ref[...] = a.astype(a_ref.dtype)


def down_kernel(a_ref, w2_ref, x_ref, o_ref, *scratch):
    acc_ref = scratch[0] if scratch else o_ref
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _residual():
        acc_ref[...] = x_ref[...].astype(jnp.float32)

    acc_ref[...] += _dot(a_ref[...], w2_ref[...])

    if scratch:
        @pl.when(k == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _mlp(x, g, w1, w2, *, bm, bf):
    m, d = x.shape
    f = w1.shape[1]
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    bn = _tile(dp, BLOCK_N, 128)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    xi, wi = x.dtype.itemsize, w1.dtype.itemsize

    need1 = 2 * (bm * dp * xi + dp * bf * wi + bm * bf * wi) + 2 * bm * dp * 4 + 3 * bm * bf * 4
    a = pl.pallas_call(
        functools.partial(up_kernel, d_true=d),
        grid=(mp // bm, fp // bf),
        in_specs=[pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bf), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, fp), w2.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"), vmem_limit_bytes=_limit(need1)),
    )(x_p, g_p, w1_p)

    separate_acc = x.dtype != jnp.float32
    need2 = (2 * (bm * bf + bf * bn) * wi + 2 * 2 * bm * bn * xi
             + (bm * bn * 4 if separate_acc else 0))
    out = pl.pallas_call(
        down_kernel,
        grid=(mp // bm, dp // bn, fp // bf),
        in_specs=[pl.BlockSpec((bm, bf), lambda i, n, k: (i, k)),
                  pl.BlockSpec((bf, bn), lambda i, n, k: (k, n)),
                  pl.BlockSpec((bm, bn), lambda i, n, k: (i, n))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, n, k: (i, n)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)] if separate_acc else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_limit(need2)),
    )(a, w2_p, x_p)
    return out[:m, :d]


def kernel(x, g, w1, w2):
    m, d = x.shape
    f = w1.shape[1]
    if g.shape != (d,) or w1.shape != (d, f) or w2.shape != (f, d):
        raise ValueError(f"shape mismatch: {x.shape=} {g.shape=} {w1.shape=} {w2.shape=}")
    sublane = 8 * max(1, 4 // min(jnp.dtype(x.dtype).itemsize, jnp.dtype(w1.dtype).itemsize))
    bm = min(BLOCK_M, _round_up(m, sublane))
    bf = min(BLOCK_F, _round_up(f, 128))
    return _mlp(x, g, w1, w2, bm=bm, bf=bf)
