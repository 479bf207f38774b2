"""Fused linear + cross-entropy with the hidden dim D split on its own grid axis.

Grid (M tiles "parallel", V tiles "arbitrary", D chunks "arbitrary"), D innermost. For one
(row tile, vocabulary tile) pair the kernel accumulates the [bm, bv] logits tile over D chunks
in an f32 VMEM scratch accumulator (zeroed at the first chunk), so neither h nor w has to be
resident at full depth: h and w blocks are [bm, BLOCK_K] and [BLOCK_K, bv], which keeps VMEM
small for large D. At the last D chunk the finished logits tile is folded into per-row f32
scratch, exactly as a one-shot online logsumexp would:
  t += the label's logit (the column whose global id equals the label; one tile has it),
  m_new = max(m, rowmax(tile)); l = l * exp(m - m_new) + rowsum(exp(tile - m_new)).
After the last V tile the row loss m + log(l) - t is stored; the [M, V] logits never reach
HBM. The wrapper averages the M row losses (O(M) glue).

Ragged edges: D is zero-padded to a multiple of the chunk outside the kernel (zero features
add exactly 0 to every dot product), vocabulary columns past V in a ragged last V tile are
masked to a large negative finite value before the logsumexp (they can never equal a label),
and rows past M in a ragged last row tile are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 512
BLOCK_V = 1024
BLOCK_K = 512
VMEM_LIMIT_BYTES = 64 << 20
_VMEM_BUDGET = 40 << 20          # estimated working set the blocks must fit in
_MASK_VALUE = -1e30              # finite: exp(_MASK_VALUE - m) == 0, never nan


def cross_entropy_kernel(h_ref, w_ref, labels_ref, loss_ref, acc_ref, m_ref, l_ref, t_ref, *,
                         vocab, block_v):
    j = pl.program_id(1)             # vocabulary tile
    k = pl.program_id(2)             # D chunk
    last_k = k == pl.num_programs(2) - 1

    @pl.when((j == 0) & (k == 0))
    def _init_row_state():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        t_ref[...] = jnp.zeros_like(t_ref)

    @pl.when(k == 0)
    def _init_logits():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(last_k)
    def _fold_tile():
        logits = acc_ref[...]                                              # [bm, bv]
        col = j * block_v + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        t_ref[...] += jnp.sum(jnp.where(col == labels_ref[...], logits, 0.0), axis=-1,
                              keepdims=True)
        if vocab % block_v:          # static: only a ragged last V tile has columns to hide
            logits = jnp.where(col < vocab, logits, _MASK_VALUE)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(logits, axis=-1, keepdims=True))
        l_ref[...] = (jnp.exp(m_prev - m_new) * l_ref[...]
                      + jnp.sum(jnp.exp(logits - m_new), axis=-1, keepdims=True))
        m_ref[...] = m_new

    @pl.when(last_k & (j == pl.num_programs(1) - 1))
    def _store():
        loss_ref[...] = m_ref[...] + jnp.log(l_ref[...]) - t_ref[...]


@functools.partial(jax.jit, static_argnames=("bm", "bv", "bk"))
def _cross_entropy(h, w, labels, *, bm, bv, bk):
    m, d = h.shape
    v = w.shape[1]
    d_pad = pl.cdiv(d, bk) * bk
    if d_pad != d:                   # zero features: exact for the dot products
        h = jnp.pad(h, ((0, 0), (0, d_pad - d)))
        w = jnp.pad(w, ((0, d_pad - d), (0, 0)))
    row_loss = pl.pallas_call(
        functools.partial(cross_entropy_kernel, vocab=v, block_v=bv),
        grid=(pl.cdiv(m, bm), pl.cdiv(v, bv), d_pad // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bv), lambda i, j, k: (k, j)),
            pl.BlockSpec((bm, 1), lambda i, j, k: (i, 0)),
        ],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j, k: (i, 0)),  # resident across j and k
        out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bv), jnp.float32)]        # logits tile accumulator
                       + [pltpu.VMEM((bm, 1), jnp.float32)] * 3,  # m, l, t
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(h, w, labels.astype(jnp.int32).reshape(m, 1))
    return jnp.sum(row_loss[:, 0]) / m


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


def _vmem_bytes(bm, bv, bk, itemsize):
    # Double-buffered h and w blocks, the f32 accumulator plus about three f32 temporaries of
    # the tile (exp, masks), and [bm, 1] columns that each fill whole 128-lane tiles.
    return 2 * (bm * bk + bk * bv) * itemsize + 4 * bm * bv * 4 + 7 * bm * 128 * 4


def kernel(h, w, labels):
    m, d = h.shape
    d2, v = w.shape
    if d != d2 or labels.shape != (m,):
        raise ValueError(f"shape mismatch: {h.shape=} {w.shape=} {labels.shape=}")
    itemsize = jnp.dtype(h.dtype).itemsize
    bm, bv, bk = _block(m, BLOCK_M, 16), _block(v, BLOCK_V, 128), _block(d, BLOCK_K, 128)
    # Large tuned blocks: halve the row tile, then the vocabulary tile, until they fit.
    while _vmem_bytes(bm, bv, bk, itemsize) > _VMEM_BUDGET and bm > 16:
        bm = max(16, bm // 2 // 16 * 16)
    while _vmem_bytes(bm, bv, bk, itemsize) > _VMEM_BUDGET and bv > 128:
        bv = max(128, bv // 2 // 128 * 128)
    return _cross_entropy(h, w, labels, bm=bm, bv=bv, bk=bk)
