"""Paged-attention decode step: a 2-D grid over (sequence, kv head), one PAGE per loop trip with an
online softmax, pages double-buffered by manual DMA.

Grid (batch, kv heads), both "parallel". Step (b, h) serves the g = hq // hkv query heads that
share kv head h, as a [g, head_dim] block of q reshaped to [batch, hkv, g, head_dim]. The
sequence lengths and the 2-D page table are scalar-prefetched into SMEM. k and v pages stay in
HBM (memory space ANY); the kernel walks the live pages of sequence b one at a time, copying the
[page_size, head_dim] slice of kv head h of each page (one async copy per operand and page) into
one of two [page_size, head_dim] VMEM slots: while page i is computed the copy of page i + 1 is in
flight. The loop starts page i + 1 and computes page i for i < n_pages - 1; the last page is
computed after the loop, so exactly n_pages pages are copied per (sequence, head).

Per page: s = q k^T * scale [g, page_size], then the online-softmax update of the running row
max m, row sum l and f32 accumulator acc [g, head_dim], all fori_loop carries; out = acc / l.

Ragged lengths: only the pages holding tokens below lengths[b] are fetched (never a page past the
table's live part), and in the last, partly used page the keys at positions >= length get a large
negative (finite) logit, so exp gives exactly 0 for them; every page fetched is a real page, so
its v rows are finite and p = 0 cancels them.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
_NT = (((1,), (1,)), ((), ()))  # A @ B^T
_NN = (((1,), (0,)), ((), ()))  # A @ B


def _kernel(lengths_ref, table_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems, *,
            page_size, scale):
    b, h = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]
    n_pages = lax.div(length + page_size - 1, page_size)  # >= 1: every sequence has a token

    def copies(i, slot):
        page = table_ref[b, i]
        return (pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[slot], sems.at[1, slot]))

    def start(i, slot):
        for c in copies(i, slot):
            c.start()

    q = q_ref[...]  # [g, d]
    g, d = q.shape

    def attend(i, slot, carry):
        m_prev, l_prev, acc_prev = carry
        for c in copies(i, slot):
            c.wait()
        k, v = k_buf[slot], v_buf[slot]  # [page_size, d]
        s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale  # [g, ps]
        pos = i * page_size + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, _MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        acc_new = alpha * acc_prev + lax.dot_general(p.astype(v.dtype), v, _NN,
                                                     preferred_element_type=jnp.float32)
        return m_new, l_new, acc_new

    def body(i, carry):
        slot = lax.rem(i, 2)
        start(i + 1, 1 - slot)
        return attend(i, slot, carry)

    start(0, 0)
    init = (jnp.full((g, 1), -jnp.inf, jnp.float32), jnp.zeros((g, 1), jnp.float32),
            jnp.zeros((g, d), jnp.float32))
    carry = lax.fori_loop(0, n_pages - 1, body, init)
    _, l, acc = attend(n_pages - 1, lax.rem(n_pages - 1, 2), carry)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


@jax.jit
def _paged_attention(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    g = hq // hkv
    q4 = q.reshape(batch, hkv, g, d)
    q_spec = pl.BlockSpec((None, None, g, d), lambda b, h, lens, table: (b, h, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, page_size=page_size, scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, hkv),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((2, page_size, d), k_pages.dtype),
                            pltpu.VMEM((2, page_size, d), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2, 2))],  # [k|v, slot]
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32), q4, k_pages, v_pages)
    return out.reshape(batch, hq, d)


def kernel(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, _, d2 = k_pages.shape
    if d2 != d or v_pages.shape != k_pages.shape or hq % hkv:
        raise ValueError(f"shape mismatch: {q.shape=} {k_pages.shape=} {v_pages.shape=}")
    if lengths.shape != (batch,) or page_indices.shape[0] != batch:
        raise ValueError(f"shape mismatch: {lengths.shape=} {page_indices.shape=}")
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices)
