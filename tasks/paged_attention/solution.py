"""Paged-attention decode step: online softmax over chunks of pages fetched by manual DMA.

Grid (batch, kv heads), both "parallel". One grid step serves the g = hq // hkv query heads
that share kv head h, as a [g, d] block. The sequence lengths and the (flattened) page table
are scalar-prefetched into SMEM. The k and v pages stay in HBM (memory_space ANY); the kernel
walks the sequence in chunks of `pages_per_chunk` pages, copying each page of a chunk into a
contiguous [chunk_tokens, d] VMEM buffer with one async copy per page. Two buffers per operand:
while the kernel computes on chunk i, the copies of chunk i + 1 are already in flight.

Only the pages that hold tokens below the sequence's length are visited. A chunk that runs past
the last such page re-fetches that page in the unused slots (always a real, finite page), and
every key at a position >= length gets a large negative logit, so it drops out of the softmax.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
# Tokens per chunk: a [g, 256] logits tile per step; the buffers stay tiny at any size.
_CHUNK_TOKENS = 256


def paged_attention_kernel(lengths_ref, pages_ref, q_ref, k_hbm, v_hbm, o_ref,
                           k_buf, v_buf, sems, *, pages_per_seq, pages_per_chunk, page_size,
                           scale):
    b = pl.program_id(0)
    h = pl.program_id(1)
    length = lengths_ref[b]
    n_pages = lax.div(length + page_size - 1, page_size)      # pages that hold live tokens
    n_chunks = lax.div(n_pages + pages_per_chunk - 1, pages_per_chunk)
    chunk_tokens = pages_per_chunk * page_size

    def page_copies(chunk, slot, j):
        # Slots past the last live page repeat it: a real page, masked out below.
        p = jnp.minimum(chunk * pages_per_chunk + j, n_pages - 1)
        page = pages_ref[b * pages_per_seq + p]
        rows = pl.ds(pl.multiple_of(j * page_size, page_size), page_size)
        return (pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot, rows], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[slot, rows], sems.at[1, slot]))

    def start_chunk(chunk, slot):
        @pl.loop(0, pages_per_chunk)
        def _start(j):
            for copy in page_copies(chunk, slot, j):
                copy.start()

    def wait_chunk(chunk, slot):
        @pl.loop(0, pages_per_chunk)
        def _wait(j):
            for copy in page_copies(chunk, slot, j):
                copy.wait()

    start_chunk(0, 0)  # every sequence has at least one token
    q = q_ref[...]     # [g, d]
    g, d = q.shape

    def body(i, carry):
        m_prev, l_prev, acc_prev = carry
        slot = lax.rem(i, 2)

        @pl.when(i + 1 < n_chunks)
        def _prefetch_next():
            start_chunk(i + 1, 1 - slot)

        wait_chunk(i, slot)
        k = k_buf[slot]  # [chunk_tokens, d]
        v = v_buf[slot]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale  # [g, chunk_tokens]
        pos = i * chunk_tokens + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, _MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v,
                                             preferred_element_type=jnp.float32)
        return m_new, l_new, acc_new

    init = (jnp.full((g, 1), -jnp.inf, jnp.float32), jnp.zeros((g, 1), jnp.float32),
            jnp.zeros((g, d), jnp.float32))
    _, l, acc = lax.fori_loop(0, n_chunks, body, init)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("pages_per_chunk",))
def _paged_attention(q, k_pages, v_pages, lengths, page_indices, *, pages_per_chunk):
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    g = hq // hkv
    q4 = q.reshape(batch, hkv, g, d)  # query head h * g + j uses kv head h
    kernel_fn = functools.partial(
        paged_attention_kernel, pages_per_seq=pages_per_seq, pages_per_chunk=pages_per_chunk,
        page_size=page_size, scale=d ** -0.5)
    chunk_tokens = pages_per_chunk * page_size
    q_spec = pl.BlockSpec((None, None, g, d), lambda b, h, lens, pages: (b, h, 0, 0))
    out = pl.pallas_call(
        kernel_fn,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, hkv),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, chunk_tokens, d), k_pages.dtype),  # k chunk, double-buffered
                pltpu.VMEM((2, chunk_tokens, d), v_pages.dtype),  # v chunk, double-buffered
                pltpu.SemaphoreType.DMA((2, 2)),                  # [k|v, slot]
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
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
    pages_per_seq = page_indices.shape[1]
    pages_per_chunk = max(1, min(pages_per_seq, _CHUNK_TOKENS // page_size))
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices,
                            pages_per_chunk=pages_per_chunk)
