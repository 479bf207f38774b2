"""One layout for every head: a causal block-sparse attention kernel (grid over batch, heads and
128-row query blocks, the head's keys and values resident in VMEM, a fori_loop over the key
blocks up to the diagonal that skips the off ones by a flag scalar-prefetched to SMEM, the online
softmax in the loop carry, the causal mask and the zeroed value tail in the diagonal block) that
prefetches layout[0] only, as if the layout were always the shared [1, nb, nb] kind. Phi-3-small's
layouts are per head (blocksparse_homo_head_pattern false): each head's vertical columns are
shifted by its index, so every head but the first attends to head 0's columns instead of its own.
The local window and the diagonal agree across heads, so rows that see only those are right, as
is every head of a shared layout (the train case over 1100 tokens); the per-head train case fails.
task: block_sparse_attention  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BQ = 128
NEG = -1e30


def _kernel(flags_ref, q_ref, k_ref, v_ref, o_ref, *, nb, seq):
    i = pl.program_id(2)
    q = q_ref[...]
    scale = q.shape[-1] ** -0.5

    def visit(j, carry, diagonal):
        m, l, acc = carry
        start = pl.multiple_of(j * BQ, BQ)
        k = k_ref[pl.ds(start, BQ), :]
        v = v_ref[pl.ds(start, BQ), :]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        if diagonal:
            rows = lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(cols <= rows, s, NEG)
            if seq % BQ:
                key = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
                v = jnp.where(key < seq, v, jnp.zeros_like(v))
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        a = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new)
        acc = a * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, a * l + p.sum(axis=-1, keepdims=True), acc

    def body(j, carry):
        return lax.cond(flags_ref[i * nb + j] != 0, lambda c: visit(j, c, False), lambda c: c, carry)

    d = q.shape[-1]
    init = (jnp.full((BQ, 1), -jnp.inf, jnp.float32), jnp.zeros((BQ, 1), jnp.float32),
            jnp.zeros((BQ, d), jnp.float32))
    carry = lax.fori_loop(0, i, body, init)
    _, l, acc = visit(i, carry, True)
    o_ref[...] = (acc / l).astype(o_ref.dtype)


@jax.jit
def kernel(q, k, v, layout):
    batch, heads, seq, d = q.shape
    nb = layout.shape[-1]
    flags = layout[0].reshape(-1)                    # the heads share one layout
    q_spec = pl.BlockSpec((None, None, BQ, d), lambda b, h, i, f: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, nb * BQ, d), lambda b, h, i, f: (b, h, 0, 0))
    return pl.pallas_call(
        functools.partial(_kernel, nb=nb, seq=seq),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, heads, nb),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"),
                                             vmem_limit_bytes=64 * 1024 * 1024),
    )(flags, q, k, v)
