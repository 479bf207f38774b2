"""softmax(x @ w) as two pallas_calls over [bm, bn] logit tiles: row statistics, then outputs.

Neither call ever holds a whole row of logits, so any N fits.
1. stats kernel, grid (M tiles "parallel", N tiles "arbitrary", K tiles "arbitrary"): each
   (i, j) logit tile is accumulated over K in an f32 VMEM tile; after its last K step the tile
   updates the row's running max m and running sum l of exp(logit - m) (l rescaled by
   exp(m_old - m_new) whenever the max grows), kept in scratch across the N tiles. After the
   last N tile the kernel writes m and 1 / l as [M, 1] float32 arrays.
2. normalize kernel, grid (M tiles, N tiles, K tiles), all but K "parallel": recomputes each
   logit tile the same way (same blocks, same order, so the same values) and stores
   exp(logit - m) * (1 / l) after its last K step.
The GEMM runs twice and only the [M, 1] statistics travel through HBM; the logits never do.

Ragged edges: the wrapper zero-pads M, N and K to the blocks. Zero K padding adds nothing to a
logit; padded N columns (logit exactly 0) are masked to -1e30 before the statistics, so they get
no probability mass; padded rows and columns of the output are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30

BLOCK_M = 512
BLOCK_N = 512
BLOCK_K = 1024
VMEM_LIMIT_BYTES = 48 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _accumulate(x_ref, w_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def stats_kernel(x_ref, w_ref, m_out, inv_l_out, acc_ref, m_ref, l_ref, *, n_true):
    j, kk = pl.program_id(1), pl.program_id(2)
    last_k = kk == pl.num_programs(2) - 1

    @pl.when((j == 0) & (kk == 0))
    def _init_stats():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)

    _accumulate(x_ref, w_ref, acc_ref)

    @pl.when(last_k)
    def _update_stats():
        s = acc_ref[...]
        bn = s.shape[1]
        if n_true % bn:
            col = j * bn + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(col < n_true, s, _MASK_VALUE)
        m_old = m_ref[...]
        m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
        l_ref[...] = (jnp.exp(m_old - m_new) * l_ref[...]
                      + jnp.sum(jnp.exp(s - m_new), axis=-1, keepdims=True))
        m_ref[...] = m_new

    @pl.when(last_k & (j == pl.num_programs(1) - 1))
    def _finish():
        m_out[...] = m_ref[...]
        inv_l_out[...] = 1.0 / l_ref[...]


def normalize_kernel(m_ref, inv_l_ref, x_ref, w_ref, o_ref, acc_ref):
    _accumulate(x_ref, w_ref, acc_ref)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = (jnp.exp(acc_ref[...] - m_ref[...]) * inv_l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _gemm_softmax(x, w, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    grid = (mp // bm, np_ // bn, kp // bk)
    x_spec = pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk))
    w_spec = pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))
    stat_spec = pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0))
    stat_shape = jax.ShapeDtypeStruct((mp, 1), jnp.float32)

    row_max, inv_l = pl.pallas_call(
        functools.partial(stats_kernel, n_true=n),
        grid=grid,
        in_specs=[x_spec, w_spec],
        out_specs=[stat_spec, stat_spec],
        out_shape=[stat_shape, stat_shape],
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32),   # logit tile accumulator
                        pltpu.VMEM((bm, 1), jnp.float32),    # running row max
                        pltpu.VMEM((bm, 1), jnp.float32)],   # running row sum
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(xp, wp)

    out = pl.pallas_call(
        normalize_kernel,
        grid=grid,
        in_specs=[stat_spec, stat_spec, x_spec, w_spec],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(row_max, inv_l, xp, wp)
    return out[:m, :n]


def kernel(x, w):
    m, k = x.shape
    k2, n = w.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {w.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    return _gemm_softmax(x, w, bm=min(BLOCK_M, _round_up(m, sublane)),
                         bn=min(BLOCK_N, _round_up(n, 128)),
                         bk=min(BLOCK_K, _round_up(k, 128)))
