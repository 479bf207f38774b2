"""Fused linear + cross-entropy: mean_i [logsumexp(h_i @ w) - (h_i @ w)[labels_i]].

Grid (M tiles, V tiles). A row tile of h stays in VMEM while the kernel walks the vocabulary in
tiles: each step computes a [bm, bv] logits tile on the MXU and folds it into three f32 VMEM
scratch columns: the running row max m, the running sum l of exp(logit - m) (rescaled whenever
m grows), and the label's logit t (picked where the global column id equals the label). After
the last V tile the row losses m + log(l) - t are stored; the [M, V] logits never exist in HBM.
The wrapper averages the M row losses (O(M) glue).

Block sizes: w is re-read once per row tile and every grid step costs a fixed overhead, so
the blocks are large: 1024 rows (w read 4 times at M = 4096) by 1024 vocabulary columns. D is
never padded (the h and w blocks span all of it), M and V edges are ragged blocks: garbage
vocabulary columns past V are masked out of the logsumexp and never match a label, garbage
rows past M are never written back. The row block halves until the blocks and the f32
temporaries fit the raised VMEM limit.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims, so
# check-size grids stay small.
BLOCK_M = 1024
BLOCK_V = 1024
_MIB = 1 << 20
_VMEM_CAP = 96 * _MIB
_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) == 0, never NaN


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


def _vmem_bytes(bm, bv, d, itemsize):
    column = bm * 128 * 4  # a [bm, 1] f32/int32 buffer occupies whole 128-lane tiles
    return (2 * (bm * d + d * bv) * itemsize  # double-buffered h and w blocks
            + 7 * column                      # label and row-loss blocks (x2), m, l, t
            + 4 * bm * bv * 4)                # f32 logits tile and its temporaries


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
    if vocab % block_v:  # static: only a ragged last V tile has columns to hide
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
    vmem = _vmem_bytes(bm, bv, d, h.dtype.itemsize)
    row_loss = pl.pallas_call(
        functools.partial(cross_entropy_kernel, vocab=v, block_v=bv),
        grid=(pl.cdiv(m, bm), pl.cdiv(v, bv)),
        in_specs=[
            pl.BlockSpec((bm, d), lambda i, j: (i, 0)),   # fetched once per row tile
            pl.BlockSpec((d, bv), lambda i, j: (0, j)),
            pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        ],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32)] * 3,   # m, l, t
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(vmem + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(h, w, labels.astype(jnp.int32).reshape(m, 1))
    return jnp.sum(row_loss[:, 0]) / m


def kernel(h, w, labels):
    m, d = h.shape
    d2, v = w.shape
    if d != d2 or labels.shape != (m,):
        raise ValueError(f"shape mismatch: {h.shape=} {w.shape=} {labels.shape=}")
    itemsize = jnp.dtype(h.dtype).itemsize
    bm, bv = _block(m, BLOCK_M), _block(v, BLOCK_V)
    # Shrink the row block, then the vocabulary tile, until the blocks fit.
    while _vmem_bytes(bm, bv, d, itemsize) > _VMEM_CAP and bm > 128:
        bm = _round_up(bm // 2, 16)
    while _vmem_bytes(bm, bv, d, itemsize) > _VMEM_CAP and bv > 128:
        bv = _round_up(bv // 2, 128)
    return _cross_entropy(h, w, labels, bm=bm, bv=bv)
