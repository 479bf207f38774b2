"""Bug inside a loop of the kernel: attention over whole-sequence blocks (one grid step per head)
with an in-kernel loop over 512-key chunks that keeps the running row max and sum but never
rescales the accumulated output when the max grows. At every check size (s <= 300) the loop runs
once and nothing needs rescaling; the bench sizes loop 8 and 6 times. A coverage rule that looks
at grid axes alone (batch and heads, several steps at every check case) sees no gap.
task: attention_fwd  expect: wrong_output
wrong at: b=1 h=1 s=1536 d=128"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 512


def attention_kernel(q_ref, k_ref, v_ref, o_ref, *, seq, chunks):
    q = q_ref[...].astype(jnp.float32) * (q_ref.shape[-1] ** -0.5)      # [s_pad, d]

    def step(c, carry):
        m, l, acc = carry
        start = pl.multiple_of(c * CHUNK, CHUNK)
        k = k_ref[pl.ds(start, CHUNK), :].astype(jnp.float32)          # [CHUNK, d]
        v = v_ref[pl.ds(start, CHUNK), :].astype(jnp.float32)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        key = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key < seq, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        l = l * jnp.exp(m - m_new) + p.sum(axis=-1, keepdims=True)
        acc = acc + jnp.dot(p, v, preferred_element_type=jnp.float32)  # not rescaled by exp(m - m_new)
        return m_new, l, acc

    rows, d = q.shape
    init = (jnp.full((rows, 1), -jnp.inf, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
            jnp.zeros((rows, d), jnp.float32))
    _, l, acc = lax.fori_loop(0, chunks, step, init)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


def kernel(q, k, v):
    b, h, s, d = q.shape
    s_pad = -(-s // CHUNK) * CHUNK
    pad = ((0, 0), (0, 0), (0, s_pad - s), (0, 0))
    qp, kp, vp = (jnp.pad(x, pad) for x in (q, k, v))
    spec = pl.BlockSpec((pl.Squeezed(), pl.Squeezed(), s_pad, d), lambda i, j: (i, j, 0, 0))
    out = pl.pallas_call(
        functools.partial(attention_kernel, seq=s, chunks=s_pad // CHUNK),
        grid=(b, h),
        in_specs=[spec, spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((b, h, s_pad, d), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=100 << 20),
    )(qp, kp, vp)
    return out[:, :, :s, :]
