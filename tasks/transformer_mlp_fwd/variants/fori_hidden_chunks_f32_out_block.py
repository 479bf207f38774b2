"""Pre-norm MLP block with a fori_loop over hidden sub-chunks inside each grid step, accumulating
straight into a float32 output block (no scratch buffers at all).

Grid (row tiles, wide hidden tiles), hidden axis "arbitrary". Each grid step receives a wide
[D, BF] block of w1 and [BF, D] block of w2 and recomputes the rms norm of its resident
[bm, D] row block (O(bm * D), small next to the step's matmuls), then runs a `lax.fori_loop`
over CHUNK-wide sub-slabs of the hidden layer: h = u @ w1[:, c], a = gelu_tanh(h), and
a @ w2[c, :] is added into the output block, which is float32 whatever x's dtype and stays
resident across the hidden axis (its index ignores it). The first hidden step seeds the output
block with the residual x. The wrapper casts the float32 result to x.dtype (a cast only).

Edges: rows are NOT padded: the row axis is a `pl.cdiv` grid; rows past M in the ragged last
block are garbage but rows are independent and never written back. D is zero-padded to a
multiple of 128 (mean of squares over the true D; zero g, w1 rows, w2 columns), F to the wide
hidden block (gelu(0) = 0 meets zero w2 rows). Padded columns are sliced off.
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
BLOCK_F = 1024   # hidden units per grid step
CHUNK = 256      # hidden units per fori_loop iteration

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


def _kernel(x_ref, g_ref, w1_ref, w2_ref, o_ref, *, d_true, chunk, n_chunks):
    j = pl.program_id(1)
    x = x_ref[...].astype(jnp.float32)

    @pl.when(j == 0)
    def _residual():
        o_ref[...] = x

    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true) + EPS)
    u = (x * r * g_ref[...].astype(jnp.float32)).astype(w1_ref.dtype)        # [bm, D]

    def body(c, carry):
        start = pl.multiple_of(c * chunk, chunk)
        h = _dot(u, w1_ref[:, pl.ds(start, chunk)])                          # [bm, chunk]
        a = 0.5 * h * (1.0 + jnp.tanh(_GELU_C * (h + 0.044715 * h * h * h)))
        o_ref[...] += _dot(a.astype(w2_ref.dtype), w2_ref[pl.ds(start, chunk), :])
        return carry

    lax.fori_loop(0, n_chunks, body, 0)


@functools.partial(jax.jit, static_argnames=("bm", "bf"))
def _mlp(x, g, w1, w2, *, bm, bf):
    m, d = x.shape
    f = w1.shape[1]
    dp, fp = _round_up(d, 128), _round_up(f, bf)
    chunk = _tile(bf, CHUNK, 128)
    x_p = jnp.pad(x, ((0, 0), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    w1_p = jnp.pad(w1, ((0, dp - d), (0, fp - f)))
    w2_p = jnp.pad(w2, ((0, fp - f), (0, dp - d)))
    xi, wi = x.dtype.itemsize, w1.dtype.itemsize
    need = (2 * bm * dp * xi + 2 * 2 * dp * bf * wi + 2 * bm * dp * 4
            + 3 * bm * dp * 4 + 3 * bm * chunk * 4)
    out = pl.pallas_call(
        functools.partial(_kernel, d_true=d, chunk=chunk, n_chunks=bf // chunk),
        grid=(pl.cdiv(m, bm), fp // bf),
        in_specs=[pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, dp), lambda i, j: (0, 0)),
                  pl.BlockSpec((dp, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((bf, dp), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, dp), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))),
    )(x_p, g_p, w1_p, w2_p)
    return out[:, :d].astype(x.dtype)


def kernel(x, g, w1, w2):
    m, d = x.shape
    f = w1.shape[1]
    if g.shape != (d,) or w1.shape != (d, f) or w2.shape != (f, d):
        raise ValueError(f"shape mismatch: {x.shape=} {g.shape=} {w1.shape=} {w2.shape=}")
    bm = m if m <= BLOCK_M else BLOCK_M   # the full dim when small, else a multiple of 16
    bf = min(BLOCK_F, _round_up(f, 128))
    return _mlp(x, g, w1, w2, bm=bm, bf=bf)
