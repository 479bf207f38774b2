"""Variable-length (ragged) flash attention with the lengths prefetched into SMEM: a whole head
per grid step, resident in VMEM, each query tile looping only over the real keys.

Grid (batch, heads, q blocks), all "parallel"; at the bench sizes a q block is the whole
sequence, so the grid is one step per head. The k and v blocks are the head's whole
[seq, head_dim] (their index map ignores the q-block axis) and q and o move in blocks of up to
BLOCK_Q rows: every operand is read from (or written to) HBM exactly once, and the pipeline
fetches the next head while this one computes. (The index maps take the prefetched lengths as
arguments, so the static model cannot evaluate them and charges every block a fetch per grid
step: one step per head keeps that charge at one read of each operand.)

The lengths are scalar-prefetched, so the kernel knows where row b's sequence ends. It loops
over query tiles of TILE_Q rows:
- a tile that starts at or after lengths[b] is all padding rows: it is written as zeros;
- any other tile walks the keys in chunks of BLOCK_K rows with a fori_loop, carrying the
  online-softmax state (running row max m, row sum l, f32 accumulator acc), and stops after the
  last chunk that holds a real key (the bound comes from lengths[b], so the static model
  charges the largest trip count, the full sequence); only the chunk that straddles the length
  pays for the element-wise key mask (lax.cond), and rows past the length are zeroed when the
  tile is written.

BLOCK_Q = 4096 makes the grid one step per head up to seq 4096; TILE_Q = BLOCK_K = 512 gives
[512, 512] f32 logits tiles (1 MiB). The resident blocks need 8 * seq * head_dim * itemsize
bytes (q, k, v, o double-buffered), so vmem_limit_bytes is raised to fit.

Nothing is padded in HBM: a sequence that is not a multiple of a tile ends inside the last q
block and inside the k/v block (blocks may overhang the array; the pipeline copies only the
rows that exist and drops overhanging output rows on write-back). Rows past the sequence lie
beyond every length, so the same key mask hides them.
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


def ragged_attention_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, *, scale, tile_q,
                            block_k):
    block_q, head_dim = q_ref.shape
    length = lengths_ref[pl.program_id(0)]
    n_chunks = lax.div(length + block_k - 1, block_k)  # chunks holding a real key

    def q_tile(i, _):
        rows = pl.ds(pl.multiple_of(i * tile_q, tile_q), tile_q)
        q_start = pl.program_id(2) * block_q + i * tile_q
        q_real = q_start < length  # the tile holds at least one real query

        @pl.when(q_real)
        def _attend():
            q = q_ref[rows, :]  # [tile_q, head_dim]

            def chunk(j, carry):
                m_prev, l_prev, acc_prev = carry
                start = pl.multiple_of(j * block_k, block_k)
                k = k_ref[pl.ds(start, block_k), :]  # [block_k, head_dim]
                v = v_ref[pl.ds(start, block_k), :]
                s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32) * scale  # [tile_q, block_k]

                def mask(s, v):
                    # Hide the keys past the length and zero their values: past the array's
                    # end the rows hold stale VMEM, and p = 0 times a stale NaN is still NaN.
                    key_pos = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                    val_pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
                    return (jnp.where(key_pos < length, s, _MASK_VALUE),
                            jnp.where(val_pos < length, v, 0))

                s, v = lax.cond(start + block_k > length, mask, lambda s, v: (s, v), s, v)
                m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
                alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
                p = jnp.exp(s - m_new)
                l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
                acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v,
                                                     preferred_element_type=jnp.float32)
                return m_new, l_new, acc_new

            init = (jnp.full((tile_q, 1), -jnp.inf, jnp.float32),
                    jnp.zeros((tile_q, 1), jnp.float32),
                    jnp.zeros((tile_q, head_dim), jnp.float32))
            _, l, acc = lax.fori_loop(0, n_chunks, chunk, init)
            # Key 0 is real for every row (length >= 1), so l > 0.
            o = acc / l
            row_pos = q_start + lax.broadcasted_iota(jnp.int32, o.shape, 0)
            o = jnp.where(row_pos < length, o, 0.0)  # rows past the length are padding
            o_ref[rows, :] = o.astype(o_ref.dtype)

        @pl.when(jnp.logical_not(q_real))
        def _padding_rows():
            o_ref[rows, :] = jnp.zeros((tile_q, head_dim), o_ref.dtype)

        return 0

    lax.fori_loop(0, block_q // tile_q, q_tile, 0)


@functools.partial(jax.jit, static_argnames=("tile_q", "block_q", "q_blocks", "block_k"))
def _ragged_attention(q, k, v, lengths, *, tile_q, block_q, q_blocks, block_k):
    batch, heads, seq, head_dim = q.shape
    kv_rows = _round_up(seq, block_k)  # the k/v block: whole chunks, overhanging the array
    kernel_fn = functools.partial(ragged_attention_kernel, scale=head_dim ** -0.5,
                                  tile_q=tile_q, block_k=block_k)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i, lengths_ref: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, kv_rows, head_dim),
                           lambda b, h, i, lengths_ref: (b, h, 0, 0))  # whole head, fetched once
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + kv_rows) * head_dim * itemsize  # q, o, k, v, double-buffered
            + 8 * tile_q * block_k * 4 + 8 * _MiB)         # logits tiles and headroom
    out = pl.pallas_call(
        kernel_fn,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, heads, q_blocks),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(lengths, q, k, v)
    return out


def kernel(q, k, v, lengths):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape or lengths.shape != q.shape[:1]:
        raise ValueError(f"expected q, k, v [batch, heads, seq, head_dim] and lengths [batch], "
                         f"got {q.shape=} {k.shape=} {v.shape=} {lengths.shape=}")
    seq = q.shape[2]
    tile_q, block_q, q_blocks = _q_blocking(seq)
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _ragged_attention(q, k, v, lengths.astype(jnp.int32), tile_q=tile_q,
                             block_q=block_q, q_blocks=q_blocks, block_k=block_k)
