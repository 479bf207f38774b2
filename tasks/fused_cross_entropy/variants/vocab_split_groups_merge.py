"""Fused linear + cross-entropy with the vocabulary split into parallel groups (a
flash-decoding-style split) and a second pallas_call that merges the groups' statistics.
The logits tile is computed transposed, so all row statistics are lane-dense [1, bm] rows.

1. partials, grid (M tiles "parallel", V groups "parallel", V tiles within the group
   "arbitrary"): each step computes the transposed logits tile [bv, bm] = w_tile^T @ h_tile^T
   with lax.dot_general contracting dim 0 of the w block with dim 1 of the h block (no
   transpose in the wrapper), then folds it into [1, bm] f32 VMEM scratch rows by reducing
   over axis 0 (sublanes): the running max m, the running sum l of exp(logit - m) (rescaled
   by exp(m_old - m_new)) and the label's logit t. After the group's last tile the three rows
   are written to [G, 1, M] arrays. Both the row tiles and the vocabulary groups are
   independent, so even a single row tile with a long vocabulary (M small, V large) has G
   parallel units of work.
2. merge, grid (M tiles, "parallel"): reads the G partials of a row tile and combines them
   exactly: m = max_g m_g, l = sum_g l_g * exp(m_g - m), t = sum_g t_g; the row loss is
   m + log(l) - t, written as a [1, M] row.
The [M, V] logits never reach HBM (3 * G floats per row do); the wrapper averages the M row
losses (O(M) glue).

Ragged edges: D is never split. The last group may have fewer tiles than the others: its
steps past the last V tile re-point at that tile (clamped index map, so no new DMA) and skip
the fold. Vocabulary ids past V in a ragged last V tile are masked to a large negative finite
value (and never equal a label). Row tiles are a multiple of 128 or all of M; rows past M in a
ragged last tile are garbage columns of the transposed tile, independent of the real ones
and never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 512
BLOCK_V = 1024
N_GROUPS = 4
_MIB = 1 << 20
_VMEM_CAP = 64 * _MIB
_MASK_VALUE = -1e30


def _block(dim, preferred):
    """The whole dim if no larger than the preferred size, else that size (a multiple of 128)."""
    return dim if dim <= preferred else preferred


def _vmem_bytes(bm, bv, d, itemsize):
    return 2 * (bm * d + d * bv) * itemsize + 4 * bm * bv * 4 + 12 * 8 * bm * 4


def partial_kernel(h_ref, w_ref, labels_ref, m_out, l_out, t_out, m_ref, l_ref, t_ref, *,
                   vocab, block_v, n_v, per_group):
    g = pl.program_id(1)
    s = pl.program_id(2)
    j = g * per_group + s                                   # global V tile

    @pl.when(s == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        t_ref[...] = jnp.zeros_like(t_ref)

    @pl.when(j < n_v)
    def _fold():
        logits_t = lax.dot_general(w_ref[...], h_ref[...], (((0,), (1,)), ((), ())),
                                   preferred_element_type=jnp.float32)   # [bv, bm]
        vid = j * block_v + lax.broadcasted_iota(jnp.int32, logits_t.shape, 0)
        t_ref[...] += jnp.sum(jnp.where(vid == labels_ref[...], logits_t, 0.0), axis=0,
                              keepdims=True)                             # [1, bm]
        if vocab % block_v:
            logits_t = jnp.where(vid < vocab, logits_t, _MASK_VALUE)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(logits_t, axis=0, keepdims=True))
        l_ref[...] = (l_ref[...] * jnp.exp(m_prev - m_new)
                      + jnp.sum(jnp.exp(logits_t - m_new), axis=0, keepdims=True))
        m_ref[...] = m_new

    @pl.when(s == pl.num_programs(2) - 1)
    def _store():
        m_out[...] = m_ref[...]
        l_out[...] = l_ref[...]
        t_out[...] = t_ref[...]


def merge_kernel(m_ref, l_ref, t_ref, loss_ref):
    m_all = m_ref[...]                                      # [G, 1, bm]
    m = jnp.max(m_all, axis=0)                              # [1, bm]
    l = jnp.sum(l_ref[...] * jnp.exp(m_all - m), axis=0)
    loss_ref[...] = m + jnp.log(l) - jnp.sum(t_ref[...], axis=0)


@functools.partial(jax.jit, static_argnames=("bm", "bv"))
def _cross_entropy(h, w, labels, *, bm, bv):
    m, d = h.shape
    v = w.shape[1]
    n_m, n_v = pl.cdiv(m, bm), pl.cdiv(v, bv)
    per_group = pl.cdiv(n_v, min(N_GROUPS, n_v))
    groups = pl.cdiv(n_v, per_group)                        # no empty group
    vmem = _vmem_bytes(bm, bv, d, h.dtype.itemsize)

    def w_map(i, g, s):
        return 0, jnp.minimum(g * per_group + s, n_v - 1)

    stat = jax.ShapeDtypeStruct((groups, 1, m), jnp.float32)
    stat_spec = pl.BlockSpec((None, 1, bm), lambda i, g, s: (g, 0, i))
    m_p, l_p, t_p = pl.pallas_call(
        functools.partial(partial_kernel, vocab=v, block_v=bv, n_v=n_v, per_group=per_group),
        grid=(n_m, groups, per_group),
        in_specs=[
            pl.BlockSpec((bm, d), lambda i, g, s: (i, 0)),
            pl.BlockSpec((d, bv), w_map),
            pl.BlockSpec((1, bm), lambda i, g, s: (0, i)),
        ],
        out_specs=[stat_spec] * 3,
        out_shape=[stat] * 3,
        scratch_shapes=[pltpu.VMEM((1, bm), jnp.float32)] * 3,     # m, l, t rows
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(vmem + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(h, w, labels.astype(jnp.int32).reshape(1, m))
    all_spec = pl.BlockSpec((groups, 1, bm), lambda i: (0, 0, i))
    row_loss = pl.pallas_call(
        merge_kernel,
        grid=(n_m,),
        in_specs=[all_spec] * 3,
        out_specs=pl.BlockSpec((1, bm), lambda i: (0, i)),
        out_shape=jax.ShapeDtypeStruct((1, m), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(m_p, l_p, t_p)
    return jnp.sum(row_loss[0]) / m


def kernel(h, w, labels):
    m, d = h.shape
    d2, v = w.shape
    if d != d2 or labels.shape != (m,):
        raise ValueError(f"shape mismatch: {h.shape=} {w.shape=} {labels.shape=}")
    itemsize = jnp.dtype(h.dtype).itemsize
    bm, bv = _block(m, BLOCK_M), _block(v, BLOCK_V)
    while _vmem_bytes(bm, bv, d, itemsize) > _VMEM_CAP and bv > 128:
        bv = max(128, bv // 2 // 128 * 128)
    while _vmem_bytes(bm, bv, d, itemsize) > _VMEM_CAP and bm > 128:
        bm = max(128, bm // 2 // 128 * 128)
    return _cross_entropy(h, w, labels, bm=bm, bv=bv)
