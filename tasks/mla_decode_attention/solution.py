"""Absorbed MLA decode: one grid row per sequence, every head at once against the shared latent
cache, an online softmax over cache blocks that stops reading at the sequence's length.

Grid (batch, cache blocks): "parallel" over sequences, "arbitrary" over the blocks, which carry
the online-softmax state (running row max m, row sum l, float32 accumulator acc, in VMEM
scratch) from one block to the next. A step holds all h query rows [h, c + 64] and one block of
the latent cache [BLOCK_K, c + 64]: the logits are one matmul over the whole row (latent and
rope columns together, [h, c + 64] x [bk, c + 64]^T -> [h, bk]), and the values are the same
block's first c columns ([h, bk] x [bk, c]), so every cached latent crosses HBM once and is
used by all heads: with DeepSeek-V3's 128 heads a block feeds 128-row matmuls.

The lengths are scalar-prefetched into SMEM. The cache's index map clamps the block index to the
last block that holds a live position, min(j, (lengths[b] - 1) // bk): past it the block index
stops changing, so the pipeline fetches nothing more for that sequence, and the kernel skips
those steps' compute (pl.when). Inside the last live block, positions >= length get a large
negative logit, so they drop out before exp (stale cache entries can be large). The output
block is written once, at the last step, as acc / l.

Block size: a decode step reads the cache once and does 2 * h * (2c + 64) FLOPs per cached
latent, which at 128 heads in bfloat16 is about a v5e's FLOP-to-byte balance, and far below it
at 16 heads; large blocks keep the grid steps few. A cache no longer than BLOCK_K is one block;
a longer one is split into equal blocks (a multiple of 16 rows), and where those overhang the
cache the rows past its end hold garbage: their logits are masked like any position past the
length, and their value rows are zeroed (a NaN times a zero weight is still NaN).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROPE_DIM = 64  # qk_rope_head_dim: the last 64 columns of q and of the cache are rope
SOFTMAX_SCALE = (128 + ROPE_DIM) ** -0.5  # DeepSeek's (qk_nope_head_dim + qk_rope_head_dim)**-0.5
# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
BLOCK_K = 4096  # tune: 1024, 2048, 4096, 8192  (cache positions per block, at most)
_QK = (((1,), (1,)), ((), ()))  # [h, e] x [t, e] -> [h, t]
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def mla_kernel(lengths_ref, q_ref, kv_ref, o_ref, m_ref, l_ref, acc_ref, *, bk, latent, overhang):
    b, j = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(j * bk < length)
    def _attend():
        q = q_ref[...]                                              # [h, c + 64]
        kv = kv_ref[...]                                            # [bk, c + 64]
        s = lax.dot_general(q, kv, _QK, preferred_element_type=jnp.float32) * SOFTMAX_SCALE
        pos = j * bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, _MASK_VALUE)                 # [h, bk]
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        v = kv[:, :latent]                                          # [bk, c]
        if overhang:  # static: the last block runs past the cache, its rows there are garbage
            row = j * bk + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(row < length, v, jnp.zeros_like(v))
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v.dtype), v,
                                                      preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bk",))
def _mla_decode(q, kv, lengths, *, bk):
    batch, heads, width = q.shape
    seq = kv.shape[1]
    latent = width - ROPE_DIM
    n_blocks = pl.cdiv(seq, bk)

    def kv_map(i, j, lens):
        return (i, jnp.minimum(j, (lens[i] - 1) // bk), 0)  # no block past the length

    itemsize = kv.dtype.itemsize
    # The cache block double-buffered, the f32 logits and their exp, q, the accumulator and out.
    need = (2 * bk * width * itemsize + 3 * _round_up(heads, 8) * bk * 4
            + 4 * heads * width * itemsize + 3 * heads * latent * 4)
    return pl.pallas_call(
        functools.partial(mla_kernel, bk=bk, latent=latent, overhang=seq % bk != 0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, n_blocks),
            in_specs=[pl.BlockSpec((None, heads, width), lambda i, j, lens: (i, 0, 0)),
                      pl.BlockSpec((None, bk, width), kv_map)],
            out_specs=pl.BlockSpec((None, heads, latent), lambda i, j, lens: (i, 0, 0)),
            scratch_shapes=[pltpu.VMEM((heads, 1), jnp.float32),        # running max
                            pltpu.VMEM((heads, 1), jnp.float32),        # running sum
                            pltpu.VMEM((heads, latent), jnp.float32)],  # accumulator
        ),
        out_shape=jax.ShapeDtypeStruct((batch, heads, latent), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(lengths.astype(jnp.int32), q, kv)


def kernel(q, kv, lengths):
    batch, _, width = q.shape
    kb, seq, kw = kv.shape
    if (kb, kw) != (batch, width) or width <= ROPE_DIM or lengths.shape != (batch,):
        raise ValueError(f"shape mismatch: {q.shape=} {kv.shape=} {lengths.shape=}")
    if seq <= BLOCK_K:
        bk = seq                                                    # one whole-cache block
    else:
        bk = _round_up(pl.cdiv(seq, pl.cdiv(seq, BLOCK_K)), 16)     # equal blocks
    return _mla_decode(q, kv, lengths, bk=bk)
