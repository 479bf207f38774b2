"""Wrong softmax scale: an absorbed-MLA decode kernel (one grid step per sequence, its whole
latent cache resident in VMEM, a fori_loop over 512-position chunks up to the scalar-prefetched
length, the online softmax in the loop carry, the tail of the last chunk masked before exp)
that scales the logits by q.shape[-1]**-0.5, the "head_dim**-0.5" of the query it is given,
which after absorption is kv_lora_rank + qk_rope_head_dim wide (576 in DeepSeek-V3). DeepSeek
keeps the scale of the heads before absorption, (qk_nope_head_dim + qk_rope_head_dim)**-0.5 =
192**-0.5, so with a 512-wide latent every logit is sqrt(3) times too small and each softmax
far flatter than the model's: the output averages many more cached values. Masking, lengths,
the value slice and the online softmax are all right; only a 128-wide latent (q 192 wide, the
two scales equal) hides it, and no train case has one.
task: mla_decode_attention  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROPE = 64
CHUNK = 512
NEG = -1e30


def _kernel(lengths_ref, q_ref, kv_ref, o_ref, *, chunk, seq):
    length = lengths_ref[pl.program_id(0)]
    q = q_ref[...]                                   # [h, c + 64]
    heads, width = q.shape
    latent = width - ROPE
    scale = width ** -0.5                            # the query's own head dim

    def body(t, carry):
        m, l, acc = carry
        start = pl.multiple_of(t * chunk, chunk) if seq % chunk == 0 else t * chunk
        kv = kv_ref[pl.ds(start, chunk), :]          # [chunk, c + 64]
        s = lax.dot_general(q, kv, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
        pos = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, NEG)
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        a = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new)
        row = start + lax.broadcasted_iota(jnp.int32, (chunk, latent), 0)
        v = jnp.where(row < length, kv[:, :latent], jnp.zeros((chunk, latent), kv.dtype))
        acc = a * acc + jnp.dot(p.astype(kv.dtype), v, preferred_element_type=jnp.float32)
        return m_new, a * l + p.sum(axis=-1, keepdims=True), acc

    init = (jnp.full((heads, 1), -jnp.inf, jnp.float32), jnp.zeros((heads, 1), jnp.float32),
            jnp.zeros((heads, latent), jnp.float32))
    _, l, acc = lax.fori_loop(0, pl.cdiv(length, chunk), body, init)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


@jax.jit
def kernel(q, kv, lengths):
    batch, heads, width = q.shape
    seq = kv.shape[1]
    chunk = min(CHUNK, -(-seq // 16) * 16)
    rows = -(-seq // chunk) * chunk                  # whole chunks: the tail rows are padding
    return pl.pallas_call(
        functools.partial(_kernel, chunk=chunk, seq=seq),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, heads, width), lambda b, lens: (b, 0, 0)),
                      pl.BlockSpec((None, rows, width), lambda b, lens: (b, 0, 0))],
            out_specs=pl.BlockSpec((None, heads, width - ROPE), lambda b, lens: (b, 0, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((batch, heads, width - ROPE), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=100 * 1024 * 1024),
    )(lengths.astype(jnp.int32), q, kv)
