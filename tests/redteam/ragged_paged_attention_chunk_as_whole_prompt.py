"""Chunked prefill taken for a whole prompt: a ragged paged attention kernel (one grid step per
(query block, sequence) pair, pages DMA'd in double-buffered chunks, online softmax, grouped
heads) that places a prefill chunk's tokens at positions 0 .. q_len - 1, as if every prefill
were a prompt's first chunk, and a decode token at kv_len - 1. A chunk of a long prompt (vLLM's
V1 scheduler chunks them) continues a prompt whose first kv_len - q_len tokens are already in
the cache: token i of the chunk sits at position kv_len - q_len + i and sees them all. This kernel
shows each chunk token only the chunk's own causal prefix (the mask is right inside the chunk,
and the page walk stops there too), so a continued chunk attends to a sliver of its context.
Decodes and first chunks (kv_len = q_len) are exactly right; every train check case holds a
chunk that continues a prompt.
task: ragged_paged_attention  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
BLOCK_Q = 256        # tune: 64, 128, 256  (query tokens per block, at most)
CHUNK_TOKENS = 256   # tune: 128, 256, 512  (keys per chunk, at most: whole pages)
FLOPS_PER_BYTE = 400  # peak bf16 FLOP/s over HBM bytes/s (v5e ~240, v6e ~560): picks block_q
VMEM_LIMIT_BYTES = 64 << 20
_BATCHED_QK = (((2,), (2,)), ((0,), (0,)))  # [h, r, d] x [h, c, d] -> [h, r, c]
_BATCHED_PV = (((2,), (1,)), ((0,), (0,)))  # [h, r, c] x [h, c, d] -> [h, r, d]


def rpa_kernel(item_block_ref, item_seq_ref, kv_lens_ref, cu_ref, pages_ref,
               q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems,
               *, pages_per_seq, pages_per_chunk, page_size, scale):
    item = pl.program_id(0)
    seq = item_seq_ref[item]
    block_q, hq, d = q_ref.shape
    hkv = k_buf.shape[2]
    g = hq // hkv
    rows = g * block_q
    chunk_tokens = pages_per_chunk * page_size

    @pl.when(seq >= 0)
    def _item():
        start = item_block_ref[item] * block_q
        q_end, kv_len = cu_ref[seq + 1], kv_lens_ref[seq]
        lo = jnp.maximum(cu_ref[seq] - start, 0)   # the item's rows of the block: [lo, hi)
        hi = jnp.minimum(q_end - start, block_q)
        q_start = cu_ref[seq]
        decode = q_end - q_start == 1
        # a decode token is the newest position; a prefill chunk starts its prompt at position 0
        shift = jnp.where(decode, kv_len - 1, start - q_start)  # block row r sits at shift + r
        n_keys = jnp.minimum(kv_len, shift + hi)   # keys the item's last row sees
        n_pages = lax.div(n_keys + page_size - 1, page_size)
        n_chunks = lax.div(n_pages + pages_per_chunk - 1, pages_per_chunk)

        def page_copies(chunk, slot, j):
            p = jnp.minimum(chunk * pages_per_chunk + j, n_pages - 1)  # past the end: the last page again
            page = pages_ref[seq * pages_per_seq + p]
            dst = pl.ds(pl.multiple_of(j * page_size, page_size), page_size)
            return (pltpu.make_async_copy(k_hbm.at[page], k_buf.at[slot, dst], sems.at[0, slot]),
                    pltpu.make_async_copy(v_hbm.at[page], v_buf.at[slot, dst], sems.at[1, slot]))

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

        # [block_q, hq, d] -> [hkv, g * block_q, d], row j * block_q + r: head h * g + j, token r.
        q = (q_ref[...].astype(jnp.float32) * scale).astype(jnp.bfloat16)
        q = jnp.swapaxes(q, 0, 1).reshape(hkv, rows, d)
        row_pos = shift + lax.rem(lax.broadcasted_iota(jnp.int32, (rows, 1), 0), block_q)

        def attend(chunk, slot, carry):
            m_prev, l_prev, acc_prev = carry
            wait_chunk(chunk, slot)
            k = jnp.swapaxes(k_buf[slot], 0, 1).astype(jnp.bfloat16)  # [hkv, chunk_tokens, d]
            v = jnp.swapaxes(v_buf[slot], 0, 1).astype(jnp.bfloat16)
            s = lax.dot_general(q, k, _BATCHED_QK, preferred_element_type=jnp.float32)
            key = chunk * chunk_tokens + lax.broadcasted_iota(jnp.int32, (1, chunk_tokens), 1)
            s = jnp.where((key <= row_pos)[None], s, _MASK_VALUE)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.exp(s - m_new)
            l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
            pv = lax.dot_general(p.astype(jnp.bfloat16), v, _BATCHED_PV, preferred_element_type=jnp.float32)
            return m_new, l_new, alpha * acc_prev + pv

        def body(chunk, carry):
            slot = lax.rem(chunk, 2)
            start_chunk(chunk + 1, 1 - slot)  # in flight while this chunk is computed
            return attend(chunk, slot, carry)

        start_chunk(0, 0)
        init = (jnp.full((hkv, rows, 1), -jnp.inf, jnp.float32), jnp.zeros((hkv, rows, 1), jnp.float32),
                jnp.zeros((hkv, rows, d), jnp.float32))
        carry = lax.fori_loop(0, n_chunks - 1, body, init)
        _, l, acc = attend(n_chunks - 1, lax.rem(n_chunks - 1, 2), carry)
        out = jnp.swapaxes((acc / l).reshape(hq, block_q, d), 0, 1).astype(o_ref.dtype)  # [block_q, hq, d]
        r = lax.broadcasted_iota(jnp.int32, (block_q, 1, 1), 0)
        o_ref[...] = jnp.where((r >= lo) & (r < hi), out, o_ref[...])


def _pages_per_chunk(pages_per_seq, page_size):
    """Pages per chunk: at most CHUNK_TOKENS keys; a divisor of pages_per_seq when one is at
    least half that many (no chunk then runs past the page table), else the most that fit."""
    most = max(1, min(pages_per_seq, CHUNK_TOKENS // page_size))
    divisor = max(n for n in range(1, most + 1) if pages_per_seq % n == 0)
    return divisor if 2 * divisor >= most else most


def _block_q(tokens, seqs, g, seq_len, itemsize):
    """The query block (a multiple of 16, at most BLOCK_Q) whose items cost least: each reads
    its sequence's keys and values once (plus its q and output blocks) and computes block_q
    rows against them, whichever of the two takes longer."""
    def cost(bq):
        items = -(-tokens // bq) + seqs - 1
        reads = 1 + bq * g / seq_len
        computes = 2 * g * bq / (itemsize * FLOPS_PER_BYTE)
        return items * max(reads, computes)

    sizes = [bq for bq in (16, 32, 64, 128, 256, 512) if bq <= max(16, BLOCK_Q)]
    best = min(sizes, key=lambda bq: (cost(bq), bq))
    return min(best, -(-tokens // 16) * 16)


def _work_items(cu_q_lens, tokens, block_q):
    """(block, sequence) of each item, in block order; sequence -1 past the last item."""
    blocks = pl.cdiv(tokens, block_q)
    seqs = cu_q_lens.shape[0] - 1
    items = blocks + seqs - 1
    starts = jnp.arange(blocks, dtype=jnp.int32) * block_q
    lasts = jnp.minimum(starts + block_q, tokens) - 1
    ends = cu_q_lens[1:]
    first = jnp.sum((ends[None, :] <= starts[:, None]).astype(jnp.int32), axis=1)  # seq of the first token
    last = jnp.sum((ends[None, :] <= lasts[:, None]).astype(jnp.int32), axis=1)    # seq of the last token
    count = last - first + 1
    offset = jnp.cumsum(count) - count  # the block's first item
    index = jnp.arange(items, dtype=jnp.int32)
    block = jnp.sum((offset[None, :] <= index[:, None]).astype(jnp.int32), axis=1) - 1
    seq = jnp.take(first, block) + index - jnp.take(offset, block)
    seq = jnp.where(index < jnp.sum(count), seq, -1)
    return block.astype(jnp.int32), seq.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("block_q", "pages_per_chunk"))
def _ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, *, block_q,
                            pages_per_chunk):
    tokens, hq, d = q.shape
    _, page_size, hkv, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    item_block, item_seq = _work_items(cu_q_lens, tokens, block_q)
    kernel_fn = functools.partial(rpa_kernel, pages_per_seq=pages_per_seq, pages_per_chunk=pages_per_chunk,
                                  page_size=page_size, scale=d ** -0.5)
    chunk_tokens = pages_per_chunk * page_size
    q_spec = pl.BlockSpec((block_q, hq, d), lambda i, blocks, *_: (blocks[i], 0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel_fn,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(item_block.shape[0],),
            in_specs=[q_spec, hbm, hbm],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, chunk_tokens, hkv, d), k_pages.dtype),  # k chunk, double-buffered
                pltpu.VMEM((2, chunk_tokens, hkv, d), v_pages.dtype),  # v chunk, double-buffered
                pltpu.SemaphoreType.DMA((2, 2)),                        # [k|v, slot]
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(item_block, item_seq, kv_lens.astype(jnp.int32), cu_q_lens, page_indices.reshape(-1).astype(jnp.int32),
      q, k_pages, v_pages)


def kernel(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
    tokens, hq, d = q.shape
    _, page_size, hkv, d2 = k_pages.shape
    seqs, pages_per_seq = page_indices.shape
    if d2 != d or v_pages.shape != k_pages.shape or hq % hkv:
        raise ValueError(f"shape mismatch: {q.shape=} {k_pages.shape=} {v_pages.shape=}")
    if kv_lens.shape != (seqs,) or cu_q_lens.shape != (seqs + 1,):
        raise ValueError(f"shape mismatch: {kv_lens.shape=} {page_indices.shape=} {cu_q_lens.shape=}")
    block_q = _block_q(tokens, seqs, hq // hkv, pages_per_seq * page_size, jnp.dtype(q.dtype).itemsize)
    return _ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, block_q=block_q,
                                   pages_per_chunk=_pages_per_chunk(pages_per_seq, page_size))
