"""Cheat: our own kernel body calls jax's flash-attention kernel body and pads itself with
~90 dead scalar equations (stored into an SMEM scratch nobody reads), so that most of the
body's equations are "ours" while all of its work is the library's.
task: attention_fwd  expect: policy_violation"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as library


def my_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, pad_ref, *, block_k, seq_len, scale):
    step = pl.program_id(2) * 5 + pl.program_id(3)
    for t in range(30):  # bookkeeping nobody reads
        step = step * 3 + t
        pad_ref[0] = step
    refs = (q_ref, k_ref, v_ref, None, None, None, o_ref)
    if block_k < seq_len:  # the library's tiled variant also takes its residuals and scratch
        refs += (None, None, m_ref, l_ref, acc_ref)
    library._flash_attention_kernel(*refs, causal=False, sm_scale=scale, block_k=block_k,
                                    kv_seq_len=seq_len, mask_value=library.DEFAULT_MASK_VALUE)


def kernel(q, k, v):
    b, h, s, d = q.shape
    block = 128 if s % 128 == 0 else s
    body = functools.partial(my_kernel, block_k=block, seq_len=s, scale=d ** -0.5)
    q_spec = pl.BlockSpec((1, 1, block, d), lambda i, j, qi, ki: (i, j, qi, 0))
    kv_spec = pl.BlockSpec((1, 1, block, d), lambda i, j, qi, ki: (i, j, ki, 0))
    return pl.pallas_call(
        body, grid=(b, h, s // block, s // block),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((1, 1, block, 128), jnp.float32),
                        pltpu.VMEM((1, 1, block, 128), jnp.float32),
                        pltpu.VMEM((1, 1, block, d), jnp.float32), pltpu.SMEM((1,), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v)
