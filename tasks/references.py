"""Reference helpers shared by several tasks, in one place that task prompts show as written.

A task's `reference` (in its own task.py) may call functions of this module and of its own
module, nothing else of ours: the prompt shows the reference with exactly these helpers'
source (chat/prompts.py, `reference_source`). Everything here is plain float32 jax.numpy.
"""
import jax
import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST
MLP_RMS_EPS = 1e-6


def softmax_last_axis(s):
    """Softmax over the last axis, max-subtracted."""
    s = s - jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def attention_reference(q, k, v, *, causal: bool):
    """Plain-jnp attention in float32; output in q.dtype."""
    out_dtype = q.dtype
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) * scale
    if causal:
        seq_q, seq_k = s.shape[-2:]
        visible = jnp.arange(seq_q)[:, None] >= jnp.arange(seq_k)[None, :]  # [seq_q, seq_k]
        s = jnp.where(visible, s, -jnp.inf)
    p = softmax_last_axis(s)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=HIGHEST)
    return o.astype(out_dtype)


def attention_bwd_reference(q, k, v, o, lse, do, *, causal: bool):
    """(dq, dk, dv) by jax.vjp of plain float32 attention; o and lse are not needed."""
    del o, lse
    dtypes = (q.dtype, k.dtype, v.dtype)
    q, k, v, do = (x.astype(jnp.float32) for x in (q, k, v, do))
    _, vjp = jax.vjp(lambda q_, k_, v_: attention_reference(q_, k_, v_, causal=causal), q, k, v)
    return tuple(g.astype(dt) for g, dt in zip(vjp(do), dtypes))


def mlp_block(x, g, w1, w2):
    """The pre-norm MLP block x + gelu_tanh(rms_norm(x) * g @ w1) @ w2 in float32 (inputs
    already float32)."""
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    u = x * lax.rsqrt(ms + MLP_RMS_EPS) * g
    hidden = jax.nn.gelu(jnp.dot(u, w1, precision=HIGHEST), approximate=True)
    return x + jnp.dot(hidden, w2, precision=HIGHEST)
