"""Wrong head grouping: a GQA decode kernel (one query head per grid step, an online softmax
over kv blocks, lengths scalar-prefetched to mask and to stop at the last live block) whose k
and v index maps send query head h to kv head h % hkv, the interleaved layout that
jnp.tile(k, (1, g, 1, 1)) would give, where the task (and Llama's repeat_kv, jnp.repeat) uses
consecutive groups, h // (hq // hkv). Every softmax is right, over the wrong keys: with 8 query
heads on 2 kv heads, heads 1, 3, 4 and 6 read the other kv head. Only where the two mappings
agree (one kv head, or one query head per kv head) is it right.
task: gqa_decode_attention  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_K = 512
MASK = -1e30


def head_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, bk, scale):
    b, j = pl.program_id(0), pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(j * bk < length)
    def _attend():
        q = q_ref[...]                                              # [1, d]
        s = lax.dot_general(q, k_ref[...], (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale   # [1, bk]
        pos = j * bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, MASK)
        m_new = jnp.maximum(m_ref[...], jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_ref[...] - m_new)
        p = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        row = j * bk + lax.broadcasted_iota(jnp.int32, v_ref.shape, 0)
        v = jnp.where(row < length, v_ref[...], jnp.zeros_like(v_ref[...]))
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v.dtype), v,
                                                      preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def kernel(q, k, v, lengths):
    batch, hq, d = q.shape
    _, hkv, seq, _ = k.shape
    bk = min(seq, BLOCK_K)

    def kv_map(i, h, j, lens):
        return (i, h % hkv, jnp.minimum(j, (lens[i] - 1) // bk), 0)   # the mistake: h % hkv

    q_spec = pl.BlockSpec((None, None, 1, d), lambda i, h, j, lens: (i, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, bk, d), kv_map)
    out = pl.pallas_call(
        functools.partial(head_kernel, bk=bk, scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, hq, pl.cdiv(seq, bk)),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((1, 1), jnp.float32), pltpu.VMEM((1, 1), jnp.float32),
                            pltpu.VMEM((1, d), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((batch, hq, 1, d), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(lengths.astype(jnp.int32), q.reshape(batch, hq, 1, d), k, v)
    return out.reshape(batch, hq, d)
