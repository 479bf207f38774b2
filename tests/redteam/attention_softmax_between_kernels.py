"""Cheat: attention as two kernels, q @ k^T and p @ v, with the softmax in XLA between them.

The [B, H, S, S] logits go to HBM, XLA's softmax reads and writes them, the second kernel
reads them back: ~1% of the reference's FLOPs run outside, so the FLOP share passes it, but
the logits are many times the size of q, k, v and o at long sequences.
task: attention_fwd  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def scores_kernel(q_ref, k_ref, s_ref):
    scale = q_ref.shape[-1] ** -0.5
    q = q_ref[0, 0].astype(jnp.float32)  # [block_q, d]
    k = k_ref[0, 0].astype(jnp.float32)  # [s, d]
    s_ref[0, 0] = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32) * scale


def mix_kernel(p_ref, v_ref, o_ref):
    p = p_ref[0, 0]  # [block_q, s]
    v = v_ref[0, 0].astype(jnp.float32)  # [s, d]
    o_ref[0, 0] = jnp.dot(p, v, preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(q, k, v):
    b, h, s, d = q.shape
    block_q = next((r for r in (128, 64, 32, 16, 8) if s % r == 0), s)
    grid = (b, h, s // block_q)
    rows = pl.BlockSpec((1, 1, block_q, d), lambda i, j, r: (i, j, r, 0))
    whole = pl.BlockSpec((1, 1, s, d), lambda i, j, r: (i, j, 0, 0))
    logit_rows = pl.BlockSpec((1, 1, block_q, s), lambda i, j, r: (i, j, r, 0))
    logits = pl.pallas_call(
        scores_kernel, grid=grid, in_specs=[rows, whole], out_specs=logit_rows,
        out_shape=jax.ShapeDtypeStruct((b, h, s, s), jnp.float32))(q, k)
    p = jax.nn.softmax(logits, axis=-1)  # in XLA, over [b, h, s, s]
    return pl.pallas_call(
        mix_kernel, grid=grid, in_specs=[logit_rows, whole], out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype))(p, v)
