"""Paged-attention decode step: gather a head's whole sequence into VMEM first, then an exact
(non-online) softmax over all its logits at once.

Grid (batch, kv heads), both "parallel". Step (b, h) serves the g = hq // hkv query heads that
share kv head h ([g, head_dim] block of q reshaped to [batch, hkv, g, head_dim]). The lengths and
the flattened page table are scalar-prefetched into SMEM; k and v pages stay in HBM (memory space
ANY). The kernel first issues the copies of every live page of sequence b (the [page_size,
head_dim] slice of kv head h; all in flight together, one semaphore per operand) into
[pages_per_seq * page_size, head_dim] VMEM buffers at the page's token position, then waits for
them all. With the whole sequence resident it computes the logits s = q k^T * scale
[g, seq_tokens] in one matmul, the exact row max, p = exp(s - max), the row sum and p v in one
matmul each: no running max, no rescaling.

Ragged lengths: only pages holding tokens below lengths[b] are copied; the buffer rows past them
hold stale VMEM. Logits of positions >= length are replaced by a large negative value (so exp
gives exactly 0) and the v rows there are zeroed with jnp.where before p v (so 0 * stale never
makes a NaN).
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
_MiB = 1 << 20


def _kernel(lengths_ref, table_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems, *,
            pages_per_seq, page_size, scale):
    b, h = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]
    n_pages = lax.div(length + page_size - 1, page_size)

    def copies(i):
        page = table_ref[b * pages_per_seq + i]
        rows = pl.ds(pl.multiple_of(i * page_size, page_size), page_size)
        return (pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[rows], sems.at[0]),
                pltpu.make_async_copy(v_hbm.at[h, page], v_buf.at[rows], sems.at[1]))

    @pl.loop(0, n_pages)
    def _start(i):
        for c in copies(i):
            c.start()

    @pl.loop(0, n_pages)
    def _wait(i):
        for c in copies(i):
            c.wait()

    q = q_ref[...]        # [g, d]
    k = k_buf[...]        # [seq_tokens, d]
    s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale  # [g, seq_tokens]
    pos = lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(pos < length, s, _MASK_VALUE)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    v = v_buf[...]
    row = lax.broadcasted_iota(jnp.int32, v.shape, 0)
    v = jnp.where(row < length, v, jnp.zeros_like(v))
    o = lax.dot_general(p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)
    o_ref[...] = (o / l).astype(o_ref.dtype)


@jax.jit
def _paged_attention(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    seq_tokens = pages_per_seq * page_size
    g = hq // hkv
    q4 = q.reshape(batch, hkv, g, d)
    q_spec = pl.BlockSpec((None, None, g, d), lambda b, h, lens, table: (b, h, 0, 0))
    itemsize = k_pages.dtype.itemsize
    vmem = 2 * seq_tokens * d * itemsize + 3 * seq_tokens * d * 4 + 8 * seq_tokens * 4 * 8
    out = pl.pallas_call(
        functools.partial(_kernel, pages_per_seq=pages_per_seq, page_size=page_size,
                          scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch, hkv),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((seq_tokens, d), k_pages.dtype),
                            pltpu.VMEM((seq_tokens, d), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2,))],  # [k|v]
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=int(min(max(vmem + 8 * _MiB, 16 * _MiB), 100 * _MiB))),
    )(lengths.astype(jnp.int32), page_indices.reshape(-1).astype(jnp.int32), q4, k_pages,
      v_pages)
    return out.reshape(batch, hq, d)


def kernel(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, _, d2 = k_pages.shape
    if d2 != d or v_pages.shape != k_pages.shape or hq % hkv:
        raise ValueError(f"shape mismatch: {q.shape=} {k_pages.shape=} {v_pages.shape=}")
    if lengths.shape != (batch,) or page_indices.shape[0] != batch:
        raise ValueError(f"shape mismatch: {lengths.shape=} {page_indices.shape=}")
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices)
