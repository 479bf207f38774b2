"""Grouped-query decode attention: one grid row per sequence, all kv heads at once, an online
softmax over kv blocks that stops reading the cache at the sequence's length.

Grid (batch, kv blocks): "parallel" over sequences, "arbitrary" over the kv blocks, which carry
the online-softmax state (running row max m, row sum l, float32 accumulator acc, in VMEM
scratch) from one block to the next. q is viewed as [b, hkv, g, d] (g = hq // hkv; query head
h * g + j uses kv head h, so the reshape is free), and one block holds every kv head of a
sequence: [hkv, g, d] queries against [hkv, BLOCK_K, d] keys and values, two batched matmuls
per block ([hkv, g, d] x [hkv, bk, d] -> [hkv, g, bk] logits, then [hkv, g, bk] x [hkv, bk, d]).

The lengths are scalar-prefetched into SMEM. The k and v index maps clamp the block index to
the last block that holds a live position, min(j, (lengths[b] - 1) // bk): past it the block
index stops changing, so the pipeline fetches nothing more for that sequence, and the kernel
skips those steps' compute (pl.when). A sequence of length 1 reads one block of the cache.
Inside the last live block, positions >= length get a large negative logit, so they drop out
of the softmax before exp (stale cache entries can be large). The output block is written once,
at the last kv step, as acc / l.

Block size: a decode step is memory-bound (each cached key is used by g queries only), so the
blocks are large to keep grid steps few: BLOCK_K = 1024 positions, 8 MiB of keys and values
per step in float32 at Llama-3-8B's 8 kv heads (64 steps at the train bench). A cache no longer
than BLOCK_K is one block; a longer one is split into equal blocks (a multiple of 16 rows),
and when those overhang the cache the rows past its end hold garbage: their logits are masked
like any position past the length, and the value rows are zeroed in that case only (a NaN
times a zero weight is still NaN).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
BLOCK_K = 1024  # tune: 256, 512, 1024, 2048  (cache positions per block, at most)
_BATCHED_QK = (((2,), (2,)), ((0,), (0,)))  # [h, g, d] x [h, t, d] -> [h, g, t]
_BATCHED_PV = (((2,), (1,)), ((0,), (0,)))  # [h, g, t] x [h, t, d] -> [h, g, d]
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, bk, scale,
                  overhang):
    b, j = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(j * bk < length)
    def _attend():
        q = q_ref[...]                                              # [hkv, g, d]
        k = k_ref[...]                                              # [hkv, bk, d]
        v = v_ref[...]
        s = lax.dot_general(q, k, _BATCHED_QK, preferred_element_type=jnp.float32) * scale
        pos = j * bk + lax.broadcasted_iota(jnp.int32, s.shape, 2)
        s = jnp.where(pos < length, s, _MASK_VALUE)                 # [hkv, g, bk]
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        if overhang:  # static: the last block runs past the cache, its rows there are garbage
            row = j * bk + lax.broadcasted_iota(jnp.int32, v.shape, 1)
            v = jnp.where(row < length, v, jnp.zeros_like(v))
        acc_ref[...] = alpha * acc_ref[...] + lax.dot_general(
            p.astype(v.dtype), v, _BATCHED_PV, preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bk",))
def _decode(q, k, v, lengths, *, bk):
    batch, hq, d = q.shape
    _, hkv, seq, _ = k.shape
    g = hq // hkv
    q4 = q.reshape(batch, hkv, g, d)  # query head h * g + j uses kv head h
    n_blocks = pl.cdiv(seq, bk)

    def kv_map(i, j, lens):
        return (i, 0, jnp.minimum(j, (lens[i] - 1) // bk), 0)  # no block past the length

    q_spec = pl.BlockSpec((None, hkv, g, d), lambda i, j, lens: (i, 0, 0, 0))
    kv_spec = pl.BlockSpec((None, hkv, bk, d), kv_map)
    itemsize = k.dtype.itemsize
    # k and v blocks double-buffered, the f32 logits and their exp, the accumulator.
    need = 4 * hkv * bk * d * itemsize + 3 * hkv * _round_up(g, 8) * bk * 4 + 8 * hkv * g * d * 4
    out = pl.pallas_call(
        functools.partial(decode_kernel, bk=bk, scale=d ** -0.5, overhang=seq % bk != 0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, n_blocks),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((hkv, g, 1), jnp.float32),   # running max
                            pltpu.VMEM((hkv, g, 1), jnp.float32),   # running sum
                            pltpu.VMEM((hkv, g, d), jnp.float32)],  # accumulator
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(lengths.astype(jnp.int32), q4, k, v)
    return out.reshape(batch, hq, d)


def kernel(q, k, v, lengths):
    batch, hq, d = q.shape
    kb, hkv, seq, kd = k.shape
    if (kb, kd) != (batch, d) or v.shape != k.shape or hq % hkv or lengths.shape != (batch,):
        raise ValueError(f"shape mismatch: {q.shape=} {k.shape=} {v.shape=} {lengths.shape=}")
    if seq <= BLOCK_K:
        bk = seq                                                    # one whole-cache block
    else:
        bk = _round_up(pl.cdiv(seq, pl.cdiv(seq, BLOCK_K)), 16)     # equal blocks
    return _decode(q, k, v, lengths, bk=bk)
