"""Variable-length (ragged) flash attention with the lengths prefetched into SMEM.

Grid (batch, heads, q blocks, kv blocks), kv last and "arbitrary": the flash-attention forward
online softmax (running row max m, row sum l and f32 accumulator in VMEM scratch). The lengths
are scalar-prefetched, so both the kernel and the index maps know where row b's sequence ends:

- kv blocks that start at or after lengths[b] hold only padding: the kernel skips them, and the
  kv index map clamps them to the last block with a real key, so the pipeline sees an unchanged
  block index and fetches nothing for them;
- q blocks that start at or after lengths[b] are all padding rows: nothing is computed, the
  output block is written as zeros, and the q and kv index maps stay on blocks already fetched;
- only a kv block that straddles the length pays for the element-wise key mask; the q block
  that straddles it zeroes its padded rows when it writes its output.

A sequence that is not a multiple of the block is padded in the wrapper; the padded positions
lie beyond every length, so the same masks hide them, and they are sliced off the output.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block_size(seq):
    """Rows per q and kv block: 512 for long sequences (fewer steps, full MXU tiles), else 128."""
    return 512 if seq >= 1024 else 128


def _last_block(length, block):
    """Index of the block holding position length - 1 (length >= 1). lax.div: no sign fix-up."""
    return lax.div(length - 1, block)


def ragged_attention_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                            scale, block_q, block_k):
    b = pl.program_id(0)
    qi = pl.program_id(2)
    kv = pl.program_id(3)
    length = lengths_ref[b]
    q_start = qi * block_q
    k_start = kv * block_k
    q_real = q_start < length  # this q block holds at least one real query

    @pl.when(kv == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def _update(masked):
        q = q_ref[...]  # [block_q, head_dim]
        k = k_ref[...]  # [block_k, head_dim]
        v = v_ref[...]  # [block_k, head_dim]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale  # [block_q, block_k]
        if masked:
            key_pos = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(key_pos < length, s, _MASK_VALUE)
        m_prev = m_ref[...]  # [block_q, 1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    k_real = k_start < length            # the kv block holds at least one real key
    k_full = k_start + block_k <= length  # ... and no padding

    @pl.when(q_real & k_real & k_full)
    def _full_block():
        _update(masked=False)

    @pl.when(q_real & k_real & jnp.logical_not(k_full))
    def _straddling_block():
        _update(masked=True)

    @pl.when(kv == pl.num_programs(3) - 1)
    def _store():
        @pl.when(q_real)
        def _real_rows():
            # Key 0 is real for every row (length >= 1), so l > 0 here.
            o = acc_ref[...] / l_ref[...]
            row_pos = q_start + lax.broadcasted_iota(jnp.int32, o.shape, 0)
            o = jnp.where(row_pos < length, o, 0.0)  # rows past the length are padding
            o_ref[...] = o.astype(o_ref.dtype)

        @pl.when(jnp.logical_not(q_real))
        def _padding_rows():
            o_ref[...] = jnp.zeros_like(o_ref)


@functools.partial(jax.jit, static_argnames=("block",))
def _ragged_attention(q, k, v, lengths, *, block):
    batch, heads, seq, head_dim = q.shape
    seq_pad = _round_up(seq, block)
    if seq_pad != seq:
        pad = ((0, 0), (0, 0), (0, seq_pad - seq), (0, 0))
        q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
    num_blocks = seq_pad // block

    def q_map(b, h, i, j, lengths_ref):
        # Padding-only q blocks stay on the last real one: already fetched, never read.
        return b, h, jnp.minimum(i, _last_block(lengths_ref[b], block)), 0

    def kv_map(b, h, i, j, lengths_ref):
        # Padding-only kv blocks (and every step of a padding-only q block) stay on the last
        # kv block with a real key: an unchanged block index, so no new DMA.
        last = _last_block(lengths_ref[b], block)
        q_real = i * block < lengths_ref[b]
        return b, h, jnp.where(q_real, jnp.minimum(j, last), last), 0

    def o_map(b, h, i, j, lengths_ref):
        return b, h, i, 0

    block_shape = (pl.squeezed, pl.squeezed, block, head_dim)
    kernel_fn = functools.partial(ragged_attention_kernel, scale=head_dim ** -0.5,
                                  block_q=block, block_k=block)
    out = pl.pallas_call(
        kernel_fn,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, heads, num_blocks, num_blocks),
            in_specs=[pl.BlockSpec(block_shape, q_map),
                      pl.BlockSpec(block_shape, kv_map),
                      pl.BlockSpec(block_shape, kv_map)],
            out_specs=pl.BlockSpec(block_shape, o_map),
            scratch_shapes=[
                pltpu.VMEM((block, 1), jnp.float32),         # m: running row max
                pltpu.VMEM((block, 1), jnp.float32),         # l: running row sum
                pltpu.VMEM((block, head_dim), jnp.float32),  # acc: unnormalised output
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(lengths, q, k, v)
    return out[:, :, :seq, :]


def kernel(q, k, v, lengths):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape or lengths.shape != q.shape[:1]:
        raise ValueError(f"expected q, k, v [batch, heads, seq, head_dim] and lengths [batch], "
                         f"got {q.shape=} {k.shape=} {v.shape=} {lengths.shape=}")
    return _ragged_attention(q, k, v, lengths.astype(jnp.int32), block=_block_size(q.shape[2]))
