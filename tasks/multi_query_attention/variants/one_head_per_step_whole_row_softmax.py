"""Multi-query attention, one query head per grid step, with the whole key row in one block and
an exact (not online) softmax.

Grid (batch, query heads, q blocks), all "parallel". The q/o blocks are [block_q, head_dim] of
one query head; the k/v blocks are the batch row's whole shared head, padded to seq_pad rows,
and their index map ignores both the head and the q-block axes, so the pipeline fetches them once
per batch row and every head reuses the resident copy. A step computes the full
[block_q, seq_pad] logits in one matmul, the exact row max and row sum over all keys at once (no
running max, no rescaling, no loop over key chunks), and the normalised weights times v in a
second matmul. block_q = 256 keeps the f32 logits at 4 MiB for seq 4096.

Ragged edges: the wrapper zero-pads q, k and v along the sequence to a multiple of block_q (so
blocks tile exactly) and slices the output back; the kernel masks the padded key columns to a
large negative logit (static: only when the sequence was padded). Padded v rows are zeros.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30
BLOCK_Q = 256
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _head_row_kernel(q_ref, k_ref, v_ref, o_ref, *, scale, seq_len):
    v = v_ref[...]
    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale  # [block_q, seq_pad]
    if seq_len != k_ref.shape[0]:  # static: the wrapper padded the sequence
        key_pos = lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key_pos < seq_len, s, _MASK_VALUE)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    inv_l = 1.0 / jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    o_ref[...] = (o * inv_l).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q",))
def _mqa(q, k, v, *, block_q):
    batch, heads, seq, head_dim = q.shape
    seq_pad = _round_up(seq, block_q)
    if seq_pad != seq:
        pad = ((0, 0), (0, 0), (0, seq_pad - seq), (0, 0))
        q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, seq_pad, head_dim),
                           lambda b, h, i: (b, 0, 0, 0))  # shared head, fetched per batch row
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + seq_pad) * head_dim * itemsize
            + 3 * block_q * seq_pad * 4 + 8 * _MiB)
    out = pl.pallas_call(
        functools.partial(_head_row_kernel, scale=head_dim ** -0.5, seq_len=seq),
        grid=(batch, heads, seq_pad // block_q),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v)
    return out[:, :, :seq, :]


def kernel(q, k, v):
    if q.ndim != 4 or k.shape != (q.shape[0], 1) + q.shape[2:] or v.shape != k.shape:
        raise ValueError(f"expected q [batch, heads, seq, head_dim] and k, v [batch, 1, seq, "
                         f"head_dim], got {q.shape=} {k.shape=} {v.shape=}")
    block_q = min(BLOCK_Q, _round_up(q.shape[2], 128))
    return _mqa(q, k, v, block_q=block_q)
