"""Causal flash-attention forward: a whole head per grid step, resident in VMEM; each query tile
loops only over the keys at or before its diagonal.

Grid (batch, heads, q blocks), all "parallel"; at the bench sizes a q block is the whole
sequence, so the grid is one step per head. The k and v blocks are the head's whole
[seq, head_dim] (their index map ignores the q-block axis) and q and o move in blocks of up to
BLOCK_Q rows: every operand is read from (or written to) HBM exactly once, and the pipeline
fetches the next head while this one computes. Inside a step the kernel loops over query tiles
of TILE_Q rows and, for each, over the keys in chunks of BLOCK_K rows, carrying the
online-softmax state (running row max m, row sum l, f32 accumulator acc) through the inner
fori_loop; the inner loop stops after the last chunk holding a key visible to the tile's last
query, so chunks above the diagonal are never computed, and only the chunks that cross the
diagonal pay for the element-wise mask (lax.cond). The inner bound depends on the tile, so the
static model charges every tile its largest trip count (the full S x S work, the reference's).

BLOCK_Q = 4096 makes the grid one step per head up to seq 4096 (the per-step cost is what is
left once every operand moves once); TILE_Q = BLOCK_K = 512 gives [512, 512] f32 logits tiles
(1 MiB) and at most one diagonal chunk per tile. The resident blocks need
8 * seq * head_dim * itemsize bytes (q, k, v, o double-buffered), so vmem_limit_bytes is
raised to fit (seq 4096, f32: 16 MiB).

Nothing is padded in HBM: a sequence that is not a multiple of a tile ends inside the last q
block and inside the k/v block (blocks may overhang the array; the pipeline copies only the
rows that exist and drops the overhanging output rows on write-back). The rows past the
sequence hold stale VMEM: those keys come after every real query, so the causal mask hides
them, and the last chunk zeroes those values (p = 0 times a stale NaN would still be NaN); the
stale query rows only produce output rows that are never written.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
BLOCK_Q = 4096  # query rows per grid step (at most)
TILE_Q = 512    # query rows per inner-loop tile
BLOCK_K = 512   # keys per inner-loop chunk
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _q_blocking(rows):
    """(tile, block, blocks): tiles of TILE_Q rows (fewer for short inputs), grouped into
    `blocks` equal grid blocks of at most BLOCK_Q rows that cover the rows with the least
    overhang."""
    tile = min(TILE_Q, _round_up(rows, 128))
    tiles = pl.cdiv(rows, tile)
    blocks = pl.cdiv(tiles, max(1, BLOCK_Q // tile))
    return tile, pl.cdiv(tiles, blocks) * tile, blocks


def causal_attention_kernel(q_ref, k_ref, v_ref, o_ref, *, scale, seq_len, tile_q, block_k):
    block_q, head_dim = q_ref.shape
    n_kv_chunks = k_ref.shape[0] // block_k

    def q_tile(i, _):
        rows = pl.ds(pl.multiple_of(i * tile_q, tile_q), tile_q)
        q = q_ref[rows, :]  # [tile_q, head_dim]
        q_start = pl.program_id(2) * block_q + i * tile_q
        # Chunks holding a key visible to the tile's last query (lax.div: operands >= 0).
        n_chunks = jnp.minimum(lax.div(q_start + tile_q - 1, block_k) + 1, n_kv_chunks)

        def chunk(j, carry):
            m_prev, l_prev, acc_prev = carry
            start = pl.multiple_of(j * block_k, block_k)
            k = k_ref[pl.ds(start, block_k), :]  # [block_k, head_dim]
            v = v_ref[pl.ds(start, block_k), :]
            if seq_len % block_k:  # static: the last chunk runs past the sequence
                def zero_tail(v):
                    val_pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
                    return jnp.where(val_pos < seq_len, v, 0)
                v = lax.cond(j == n_kv_chunks - 1, zero_tail, lambda v: v, v)
            # q @ k^T without materialising k^T: contract the head_dim of both.
            s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale  # [tile_q, block_k]

            def mask(s):  # key j visible to query i iff j <= i
                query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                key = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                return jnp.where(key <= query, s, _MASK_VALUE)

            # The chunk's last key comes after the tile's first query: it crosses the diagonal.
            s = lax.cond(start + block_k - 1 > q_start, mask, lambda s: s, s)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
            p = jnp.exp(s - m_new)
            l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
            acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v,
                                                 preferred_element_type=jnp.float32)
            return m_new, l_new, acc_new

        init = (jnp.full((tile_q, 1), -jnp.inf, jnp.float32), jnp.zeros((tile_q, 1), jnp.float32),
                jnp.zeros((tile_q, head_dim), jnp.float32))
        _, l, acc = lax.fori_loop(0, n_chunks, chunk, init)
        # Every query row saw key 0 (chunk 0 always runs), so l > 0.
        o_ref[rows, :] = (acc / l).astype(o_ref.dtype)
        return 0

    lax.fori_loop(0, q_ref.shape[0] // tile_q, q_tile, 0)


@functools.partial(jax.jit, static_argnames=("tile_q", "block_q", "q_blocks", "block_k"))
def _causal_attention(q, k, v, *, tile_q, block_q, q_blocks, block_k):
    batch, heads, seq, head_dim = q.shape
    kv_rows = _round_up(seq, block_k)  # the k/v block: whole chunks, overhanging the array
    kernel_fn = functools.partial(causal_attention_kernel, scale=head_dim ** -0.5, seq_len=seq,
                                  tile_q=tile_q, block_k=block_k)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, kv_rows, head_dim),
                           lambda b, h, i: (b, h, 0, 0))  # the whole head, fetched once
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + kv_rows) * head_dim * itemsize  # q, o, k, v, double-buffered
            + 8 * tile_q * block_k * 4 + 8 * _MiB)         # logits tiles and headroom
    out = pl.pallas_call(
        kernel_fn,
        grid=(batch, heads, q_blocks),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v)
    return out


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of one shape [batch, heads, seq, head_dim], "
                         f"got {q.shape=} {k.shape=} {v.shape=}")
    seq = q.shape[2]
    tile_q, block_q, q_blocks = _q_blocking(seq)
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _causal_attention(q, k, v, tile_q=tile_q, block_q=block_q, q_blocks=q_blocks,
                             block_k=block_k)
