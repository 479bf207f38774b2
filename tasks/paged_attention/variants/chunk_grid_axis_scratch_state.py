"""Paged-attention decode step: the walk over the page table is a GRID axis, not an in-kernel
loop; the online-softmax state lives in VMEM scratch across grid steps and the page copies of the
next grid step are started one step ahead.

Grid (batch, chunks): batch "parallel", the chunk axis "arbitrary" (the reduction axis). Chunk c
of sequence b is pages [c * PPC, (c + 1) * PPC) of its page table row (PPC pages per chunk). One
step serves every query head of the sequence as a [hkv, g, head_dim] block (q reshaped; query
head h * g + j uses kv head h). Lengths and the flattened page table are scalar-prefetched into
SMEM; k and v pages stay in HBM (memory space ANY). Each page of a chunk is copied, for all kv
heads at once ([hkv, page_size, head_dim]), into a [2, hkv, PPC * page_size, head_dim] VMEM
buffer per operand. Cross-step double buffering: the first step of a sequence starts chunk 0;
every live step c starts the copies of chunk c + 1 (if live) into the other slot before waiting
for its own, so a chunk's copies fly while the previous grid step computes.

The running max m, sum l [hkv, g, 1] and the f32 accumulator [hkv, g, head_dim] are VMEM
scratch, reset at the sequence's first step, updated by live steps, and turned into acc / l in
the output block at the sequence's last step (the output block's index ignores the chunk axis,
so it is written back once per sequence).

Ragged lengths: steps whose chunk starts at or past lengths[b] do nothing (pl.when; their copies
are never started). In a live chunk, slots past the last live page re-fetch that page (always a
real, finite page), and keys at positions >= length get a large negative logit, so exp gives
exactly 0 for them.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
CHUNK_TOKENS = 128  # tokens per grid step, at most (whole pages)
_BATCHED = (((2,), (2,)), ((0,), (0,)))     # [h, g, d] x [h, t, d] -> [h, g, t]
_BATCHED_PV = (((2,), (1,)), ((0,), (0,)))  # [h, g, t] x [h, t, d] -> [h, g, d]


def _kernel(lengths_ref, table_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems,
            m_ref, l_ref, acc_ref, *, pages_per_seq, ppc, page_size, scale):
    b, c = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]
    n_pages = lax.div(length + page_size - 1, page_size)
    n_live = lax.div(n_pages + ppc - 1, ppc)  # live chunks of this sequence (>= 1)
    chunk_tokens = ppc * page_size

    def page_copies(chunk, slot, j):
        p = jnp.minimum(chunk * ppc + j, n_pages - 1)
        page = table_ref[b * pages_per_seq + p]
        rows = pl.ds(pl.multiple_of(j * page_size, page_size), page_size)
        return (pltpu.make_async_copy(k_hbm.at[:, page], k_buf.at[slot, :, rows], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[:, page], v_buf.at[slot, :, rows], sems.at[1, slot]))

    def start_chunk(chunk, slot):
        @pl.loop(0, ppc)
        def _(j):
            for cp in page_copies(chunk, slot, j):
                cp.start()

    def wait_chunk(chunk, slot):
        @pl.loop(0, ppc)
        def _(j):
            for cp in page_copies(chunk, slot, j):
                cp.wait()

    @pl.when(c == 0)
    def _first():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)
        start_chunk(0, 0)

    @pl.when(c < n_live)
    def _live():
        slot = lax.rem(c, 2)

        @pl.when(c + 1 < n_live)
        def _prefetch():
            start_chunk(c + 1, 1 - slot)

        wait_chunk(c, slot)
        q = q_ref[...]
        k, v = k_buf[slot], v_buf[slot]  # [hkv, chunk_tokens, d]
        s = lax.dot_general(q, k, _BATCHED, preferred_element_type=jnp.float32) * scale
        pos = c * chunk_tokens + lax.broadcasted_iota(jnp.int32, s.shape, 2)
        s = jnp.where(pos < length, s, _MASK_VALUE)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + lax.dot_general(
            p.astype(v.dtype), v, _BATCHED_PV, preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(c == pl.num_programs(1) - 1)
    def _last():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("ppc",))
def _paged_attention(q, k_pages, v_pages, lengths, page_indices, *, ppc):
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    g = hq // hkv
    q4 = q.reshape(batch, hkv, g, d)
    n_chunks = pl.cdiv(pages_per_seq, ppc)
    q_spec = pl.BlockSpec((None, hkv, g, d), lambda b, c, lens, table: (b, 0, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, pages_per_seq=pages_per_seq, ppc=ppc, page_size=page_size,
                          scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, n_chunks),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, hkv, ppc * page_size, d), k_pages.dtype),
                pltpu.VMEM((2, hkv, ppc * page_size, d), v_pages.dtype),
                pltpu.SemaphoreType.DMA((2, 2)),               # [k|v, slot]
                pltpu.VMEM((hkv, g, 1), jnp.float32),          # running max
                pltpu.VMEM((hkv, g, 1), jnp.float32),          # running sum
                pltpu.VMEM((hkv, g, d), jnp.float32),          # accumulator
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(lengths.astype(jnp.int32), page_indices.reshape(-1).astype(jnp.int32), q4, k_pages,
      v_pages)
    return out.reshape(batch, hq, d)


def kernel(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, page_size, d2 = k_pages.shape
    if d2 != d or v_pages.shape != k_pages.shape or hq % hkv:
        raise ValueError(f"shape mismatch: {q.shape=} {k_pages.shape=} {v_pages.shape=}")
    if lengths.shape != (batch,) or page_indices.shape[0] != batch:
        raise ValueError(f"shape mismatch: {lengths.shape=} {page_indices.shape=}")
    ppc = max(1, min(page_indices.shape[1], CHUNK_TOKENS // page_size))
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices, ppc=ppc)
