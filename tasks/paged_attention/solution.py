"""Paged-attention decode step: one grid step per sequence, all kv heads at once, online softmax
over chunks of pages fetched by manual DMA.

Grid (batch,), "parallel". One grid step serves every query head of sequence b as a
[hkv, g, d] block (g = hq // hkv query heads share kv head h). The sequence lengths and the
(flattened) page table are scalar-prefetched into SMEM. The k and v pages stay in HBM (memory
space ANY); the kernel walks the sequence in chunks of `pages_per_chunk` pages, copying each
page of a chunk, for all kv heads at once ([hkv, page_size, d], one strided async copy per page
and operand), into a [hkv, chunk_tokens, d] VMEM buffer. Two buffers per operand: while the
kernel computes on chunk i, the copies of chunk i + 1 are in flight. The loop issues the copies
of chunk i + 1 and computes chunk i for i < n_chunks - 1, and the last chunk is computed after
the loop, so every sequence starts exactly n_chunks chunk copies (the static model charges
each copy in a loop once per trip of its largest trip count, so a loop that also started a
copy on its last trip would be charged one chunk too many).

Per chunk, the logits of all kv heads come from one batched matmul [hkv, g, d] x
[hkv, chunk_tokens, d]; the running row max, row sum and f32 accumulator are [hkv, g, ...]
loop carries. Only the pages that hold tokens below the sequence's length are visited. A chunk
that runs past the last such page re-fetches that page in the unused slots (always a real,
finite page), and every key at a position >= length gets a large negative logit, so it drops
out of the softmax.

One step per sequence keeps the grid (and its per-step cost) at `batch` steps, and one copy per
page moves all heads of that page. CHUNK_TOKENS = 256 tokens per chunk: the chunk holds a
whole number of pages, the largest divisor of pages_per_seq that fits when one is close (so no
chunk copies pages the table does not have), and the buffers stay small (bench, f32: 2 MiB
per operand and slot).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
CHUNK_TOKENS = 256  # tune: 32, 64, 128, 256  (tokens per chunk, at most: whole pages)
_BATCHED = (((2,), (2,)), ((0,), (0,)))  # [h, g, d] x [h, t, d] -> [h, g, t]
_BATCHED_PV = (((2,), (1,)), ((0,), (0,)))  # [h, g, t] x [h, t, d] -> [h, g, d]


def paged_attention_kernel(lengths_ref, pages_ref, q_ref, k_hbm, v_hbm, o_ref,
                           k_buf, v_buf, sems, *, pages_per_seq, pages_per_chunk, page_size,
                           scale):
    b = pl.program_id(0)
    length = lengths_ref[b]
    n_pages = lax.div(length + page_size - 1, page_size)      # pages that hold live tokens
    n_chunks = lax.div(n_pages + pages_per_chunk - 1, pages_per_chunk)
    chunk_tokens = pages_per_chunk * page_size

    def page_copies(chunk, slot, j):
        # Slots past the last live page repeat it: a real page, masked out below.
        p = jnp.minimum(chunk * pages_per_chunk + j, n_pages - 1)
        page = pages_ref[b * pages_per_seq + p]
        rows = pl.ds(pl.multiple_of(j * page_size, page_size), page_size)
        return (pltpu.make_async_copy(k_hbm.at[:, page], k_buf.at[slot, :, rows], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[:, page], v_buf.at[slot, :, rows], sems.at[1, slot]))

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

    q = q_ref[...]  # [hkv, g, d]
    hkv, g, d = q.shape

    def attend(i, slot, carry):
        """The online-softmax update for chunk i, whose pages are in buffer `slot`."""
        m_prev, l_prev, acc_prev = carry
        wait_chunk(i, slot)
        k = k_buf[slot]  # [hkv, chunk_tokens, d]
        v = v_buf[slot]
        s = lax.dot_general(q, k, _BATCHED,
                            preferred_element_type=jnp.float32) * scale  # [hkv, g, chunk_tokens]
        pos = i * chunk_tokens + lax.broadcasted_iota(jnp.int32, s.shape, 2)
        s = jnp.where(pos < length, s, _MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
        acc_new = alpha * acc_prev + lax.dot_general(p.astype(v.dtype), v, _BATCHED_PV,
                                                     preferred_element_type=jnp.float32)
        return m_new, l_new, acc_new

    def body(i, carry):
        slot = lax.rem(i, 2)
        start_chunk(i + 1, 1 - slot)  # in flight while chunk i is computed
        return attend(i, slot, carry)

    start_chunk(0, 0)  # every sequence has at least one token
    init = (jnp.full((hkv, g, 1), -jnp.inf, jnp.float32), jnp.zeros((hkv, g, 1), jnp.float32),
            jnp.zeros((hkv, g, d), jnp.float32))
    carry = lax.fori_loop(0, n_chunks - 1, body, init)
    _, l, acc = attend(n_chunks - 1, lax.rem(n_chunks - 1, 2), carry)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


def _pages_per_chunk(pages_per_seq, page_size):
    """Pages per chunk: at most CHUNK_TOKENS tokens; a divisor of pages_per_seq when one is at
    least half that size (then no chunk runs past the page table), else the most that fit."""
    most = max(1, min(pages_per_seq, CHUNK_TOKENS // page_size))
    divisor = max(n for n in range(1, most + 1) if pages_per_seq % n == 0)
    return divisor if 2 * divisor >= most else most


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
    q_spec = pl.BlockSpec((None, hkv, g, d), lambda b, lens, pages: (b, 0, 0, 0))
    out = pl.pallas_call(
        kernel_fn,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch,),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, hkv, chunk_tokens, d), k_pages.dtype),  # k chunk, double-buffered
                pltpu.VMEM((2, hkv, chunk_tokens, d), v_pages.dtype),  # v chunk, double-buffered
                pltpu.SemaphoreType.DMA((2, 2)),                       # [k|v, slot]
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
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
    pages_per_chunk = _pages_per_chunk(page_indices.shape[1], page_size)
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices,
                            pages_per_chunk=pages_per_chunk)
