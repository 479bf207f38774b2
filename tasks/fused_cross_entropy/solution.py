"""Fused linear + cross-entropy: mean_i [logsumexp(h_i @ w) - (h_i @ w)[labels_i]].

Grid (M tiles, V tiles). A row tile of h stays in VMEM while the kernel walks the vocabulary in
tiles: each step computes a [bm, bv] logits tile on the MXU and folds it into three f32 VMEM
scratch columns: the running row max m, the running sum l of exp(logit - m) (rescaled whenever
m grows), and the label's logit t (picked where the global column id equals the label). After
the last V tile the row losses m + log(l) - t are stored; the [M, V] logits never exist in HBM.
Padded vocabulary columns (zero weights) are masked out of the logsumexp. The wrapper averages
the M row losses (O(M) glue).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_VMEM_BUDGET = 10 * 1024 * 1024  # pipelined blocks (x2 buffers) + scratch, bytes
_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) == 0, never NaN


def _round_up(x, m):
    return (x + m - 1) // m * m


def _vmem_bytes(bm, bv, d, itemsize):
    column = bm * 128 * 4  # a [bm, 1] f32/int32 buffer occupies whole 128-lane tiles
    return (2 * bm * d * itemsize       # h blocks
            + 2 * d * bv * itemsize     # w blocks
            + 2 * column                # label blocks
            + 2 * column                # row-loss output blocks
            + 3 * column)               # m, l, t scratch


def _choose_blocks(m, d, v, dtype):
    itemsize = jnp.dtype(dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    for bm in (512, 256, 128, 64, 32, 16):
        bm = min(max(bm, sublane), _round_up(m, sublane))
        for bv in (512, 256, 128):
            bv = min(bv, _round_up(v, 128))
            if _vmem_bytes(bm, bv, d, itemsize) <= _VMEM_BUDGET:
                return bm, bv
    raise ValueError(f"D={d} is too wide for one VMEM row block")


def cross_entropy_kernel(h_ref, w_ref, labels_ref, loss_ref, m_ref, l_ref, t_ref, *,
                         vocab, block_v):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        t_ref[...] = jnp.zeros_like(t_ref)

    logits = jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)  # [bm, bv]
    col = j * block_v + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    # The label's logit: exactly one column of one V tile matches each row's label.
    t_ref[...] += jnp.sum(jnp.where(col == labels_ref[...], logits, 0.0), axis=-1, keepdims=True)
    if vocab % block_v:  # static: only a padded vocabulary has columns to hide
        logits = jnp.where(col < vocab, logits, _MASK_VALUE)

    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(logits, axis=-1, keepdims=True))
    l_ref[...] = (jnp.exp(m_prev - m_new) * l_ref[...]
                  + jnp.sum(jnp.exp(logits - m_new), axis=-1, keepdims=True))
    m_ref[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _store():
        loss_ref[...] = m_ref[...] + jnp.log(l_ref[...]) - t_ref[...]


@functools.partial(jax.jit, static_argnames=("bm", "bv"))
def _cross_entropy(h, w, labels, *, bm, bv):
    m, d = h.shape
    v = w.shape[1]
    mp, vp, dp = _round_up(m, bm), _round_up(v, bv), _round_up(d, 128)
    # Zero padding: padded D adds nothing; padded rows are dropped before the mean; padded
    # vocabulary columns are masked in the kernel.
    hp = jnp.pad(h, ((0, mp - m), (0, dp - d)))
    wp = jnp.pad(w, ((0, dp - d), (0, vp - v)))
    lp = jnp.pad(labels.astype(jnp.int32), (0, mp - m)).reshape(mp, 1)
    row_loss = pl.pallas_call(
        functools.partial(cross_entropy_kernel, vocab=v, block_v=bv),
        grid=(mp // bm, vp // bv),
        in_specs=[
            pl.BlockSpec((bm, dp), lambda i, j: (i, 0)),   # fetched once per row tile
            pl.BlockSpec((dp, bv), lambda i, j: (0, j)),
            pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        ],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32)] * 3,   # m, l, t
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(hp, wp, lp)
    return jnp.sum(row_loss[:m, 0]) / m


def kernel(h, w, labels):
    m, d = h.shape
    d2, v = w.shape
    if d != d2 or labels.shape != (m,):
        raise ValueError(f"shape mismatch: {h.shape=} {w.shape=} {labels.shape=}")
    bm, bv = _choose_blocks(m, _round_up(d, 128), v, h.dtype)
    return _cross_entropy(h, w, labels, bm=bm, bv=bv)
