"""Pre-norm MLP block on a 3-D grid that chunks D, applying the rms scale AFTER the up matmul.

The rms factor r = rsqrt(mean(x^2) + eps) is one scalar per row, so
    (x * r * g) @ w1 = r * ((x * g) @ w1).
Grid (row tiles i, hidden tiles j, D chunks k), j and k "arbitrary". Each step takes an x block
[bm, bk] and a w1 block [bk, bf]: it adds (x * g) @ w1 into an f32 VMEM scratch [bm, bf] and the
chunk's sum of squares into an f32 [bm, 1] scratch, so the row statistics are built up one D
chunk at a time alongside the matmul (one pass, no normalised copy of the rows). At the last D
chunk the slab is scaled by r, passed through gelu_tanh, and its down-projection a @ w2[j]
(a [bf, D] block whose index ignores k) is added into an f32 [bm, D] VMEM output accumulator.
The residual is written into that accumulator chunk by chunk during the first hidden tile's D
sweep (x[:, k-chunk] into columns k*bk ...), before its first down-projection lands. The output
row block is stored after the last (j, k) step.

Edges: zero padding in the wrapper: D to a multiple of 128 (zero columns add nothing to the
sum of squares, which is divided by the true D, nor to the matmul), F to the hidden block
(gelu(0) = 0 meets zero w2 rows), M to the row block. The padding is sliced off.
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
BLOCK_K = 512

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _tile(n, preferred, align):
    if n <= preferred:
        return n
    return next(c for c in range(preferred - preferred % align, 0, -align) if n % c == 0)


def _dot(a, b):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def _kernel(x_ref, g_ref, w1_ref, w2_ref, o_ref, h_acc, ss_acc, out_acc, *, d_true, bk):
    j = pl.program_id(1)
    k = pl.program_id(2)
    last_k = k == pl.num_programs(2) - 1

    @pl.when(k == 0)
    def _zero_slab():
        h_acc[...] = jnp.zeros_like(h_acc)
        ss_acc[...] = jnp.zeros_like(ss_acc)

    x = x_ref[...].astype(jnp.float32)                                     # [bm, bk]

    @pl.when(j == 0)
    def _residual_chunk():
        out_acc[:, pl.ds(pl.multiple_of(k * bk, bk), bk)] = x

    ss_acc[...] += jnp.sum(x * x, axis=-1, keepdims=True)
    xg = (x * g_ref[...].astype(jnp.float32)).astype(w1_ref.dtype)
    h_acc[...] += _dot(xg, w1_ref[...])

    @pl.when(last_k)
    def _down():
        r = lax.rsqrt(ss_acc[...] * (1.0 / d_true) + EPS)                 # [bm, 1]
        h = h_acc[...] * r
        a = 0.5 * h * (1.0 + jnp.tanh(_GELU_C * (h + 0.044715 * h * h * h)))
        out_acc[...] += _dot(a.astype(w2_ref.dtype), w2_ref[...])

    @pl.when(last_k & (j == pl.num_programs(1) - 1))
    def _store():
        o_ref[...] = out_acc[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _mlp(x, g, w1, w2, *, bm, bf):
    m, d = x.shape
    f = w1.shape[1]
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, bf)
    bk = _tile(dp, BLOCK_K, 128)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    xi, wi = x.dtype.itemsize, w1.dtype.itemsize
    need = (2 * (bm * bk * xi + bk * bf * wi + bf * dp * wi + bm * dp * xi)
            + bm * bf * 4 + bm * 128 * 4 + bm * dp * 4 + 2 * bm * dp * 4 + 4 * bm * bf * 4)
    out = pl.pallas_call(
        functools.partial(_kernel, d_true=d, bk=bk),
        grid=(mp // bm, fp // bf, dp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((1, bk), lambda i, j, k: (0, k)),
                  pl.BlockSpec((bk, bf), lambda i, j, k: (k, j)),
                  pl.BlockSpec((bf, dp), lambda i, j, k: (j, 0))],
        out_specs=pl.BlockSpec((bm, dp), lambda i, j, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bf), jnp.float32),    # (x * g) @ w1 over D chunks
                        pltpu.VMEM((bm, 1), jnp.float32),     # sum of squares over D chunks
                        pltpu.VMEM((bm, dp), jnp.float32)],   # x + MLP so far
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))),
    )(x_p, g_p, w1_p, w2_p)
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
