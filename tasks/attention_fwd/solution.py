"""Flash-attention forward (no mask): online softmax over kv blocks with f32 VMEM scratch.

Grid (batch, heads, q blocks, kv blocks). The kv axis is last and "arbitrary": for one q block the
kernel walks the kv blocks in order, keeping a running row max m, a running row sum l and an f32
accumulator acc in VMEM scratch, and writes o = acc / l after the last kv block. A sequence that is
not a multiple of the block is padded in the wrapper; padded keys are masked out of the softmax and
padded query rows are sliced off the output.
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
    """Rows per q block and per kv block.

    Long sequences take 512: fewer grid steps and a [512, 512] logits tile that keeps the MXU busy.
    Short ones take 128 (the smallest lane-aligned kv tile) so padding wastes little.
    """
    return 512 if seq >= 1024 else 128


def attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                     scale, seq_len, block_k):
    kv = pl.program_id(3)

    @pl.when(kv == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    q = q_ref[...]  # [block_q, head_dim]
    k = k_ref[...]  # [block_k, head_dim]
    v = v_ref[...]  # [block_k, head_dim]
    # q @ k^T without materialising k^T: contract the head_dim of both.
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale  # [block_q, block_k]
    if seq_len % block_k:  # static: only a padded sequence has keys to hide
        key_pos = kv * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)

    m_prev = m_ref[...]  # [block_q, 1]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
    p = jnp.exp(s - m_new)  # [block_q, block_k]
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
        p.astype(v.dtype), v, preferred_element_type=jnp.float32)  # [block_q, head_dim]
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _attention(q, k, v, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    seq_pad = _round_up(seq, max(block_q, block_k))
    if seq_pad != seq:
        pad = ((0, 0), (0, 0), (0, seq_pad - seq), (0, 0))
        q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
    grid = (batch, heads, seq_pad // block_q, seq_pad // block_k)
    kernel_fn = functools.partial(attention_kernel, scale=head_dim ** -0.5, seq_len=seq,
                                  block_k=block_k)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i, j: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_k, head_dim),
                           lambda b, h, i, j: (b, h, j, 0))
    out = pl.pallas_call(
        kernel_fn,
        grid=grid,
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),         # m: running row max
            pltpu.VMEM((block_q, 1), jnp.float32),         # l: running row sum
            pltpu.VMEM((block_q, head_dim), jnp.float32),  # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v)
    return out[:, :, :seq, :]


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"expected q, k, v of one shape [batch, heads, seq, head_dim], "
                         f"got {q.shape=} {k.shape=} {v.shape=}")
    block = _block_size(q.shape[2])
    return _attention(q, k, v, block_q=block, block_k=block)
