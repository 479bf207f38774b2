"""Softmax over whole-row slabs with an in-kernel online sweep over column chunks, then a
write sweep, both as lax.fori_loops inside one grid step.

Grid: one "parallel" axis over row blocks of whole rows (x read from HBM once, output written
once). Inside a step:
  1. a fori_loop walks the row in CHUNK-wide, 128-aligned column chunks carrying the running
     row max m and running sum l ([block_rows, 1] f32): m_new = max(m, max(chunk)),
     l = l * exp(m - m_new) + sum(exp(chunk - m_new)). The d % CHUNK columns after the last
     whole chunk are a static tail slice folded in the same way after the loop;
  2. inv_l = 1 / l, then a second fori_loop (plus the same static tail) re-reads each chunk
     from the VMEM-resident block and writes exp(x - m) * inv_l.
Only [block_rows, CHUNK] float32 temporaries are live at a time, rather than f32 copies of
the whole slab. The first chunk (or the tail, when the row is narrower than CHUNK) seeds m
directly, so exp(m - m_new) never sees -inf - -inf.

Ragged edges: no padding and no masks: the loops cover only whole chunks inside d and the
static tail covers exactly the remainder. A ragged last row block computes on rows that are
never written back; few rows make one full-dim block.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 512
MAX_ROWS = 256
_BLOCK_BYTES = 4 << 20              # one input row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 48 << 20


def _fold(m, l, x):
    """Online update of (running max, running sum of exp(x - max)) with a [br, w] chunk."""
    m_new = jnp.maximum(m, jnp.max(x, axis=1, keepdims=True))
    return m_new, l * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new), axis=1, keepdims=True)


def softmax_kernel(x_ref, o_ref):
    br, d = x_ref.shape
    n_full = d // CHUNK
    tail = d % CHUNK
    t0 = n_full * CHUNK

    # Seed from a real chunk (the first whole chunk, else the tail): m is finite from here on.
    first = x_ref[:, :CHUNK] if n_full else x_ref[:, t0:]
    first = first.astype(jnp.float32)
    m = jnp.max(first, axis=1, keepdims=True)
    l = jnp.sum(jnp.exp(first - m), axis=1, keepdims=True)

    def stats(c, carry):
        c0 = pl.multiple_of(c * CHUNK, CHUNK)
        return _fold(*carry, x_ref[:, pl.ds(c0, CHUNK)].astype(jnp.float32))

    if n_full > 1:
        m, l = jax.lax.fori_loop(1, n_full, stats, (m, l))
    if tail and n_full:
        m, l = _fold(m, l, x_ref[:, t0:].astype(jnp.float32))
    inv_l = 1.0 / l

    def write(c, carry):
        c0 = pl.multiple_of(c * CHUNK, CHUNK)
        cols = pl.ds(c0, CHUNK)
        e = jnp.exp(x_ref[:, cols].astype(jnp.float32) - m)
        o_ref[:, cols] = (e * inv_l).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, n_full, write, 0)
    if tail:
        e = jnp.exp(x_ref[:, t0:].astype(jnp.float32) - m)
        o_ref[:, t0:] = (e * inv_l).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _softmax_2d(x, *, br):
    rows, d = x.shape
    spec = pl.BlockSpec((br, d), lambda i: (i, 0))
    return pl.pallas_call(
        softmax_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    if x.ndim < 1:
        raise ValueError("softmax needs at least one axis")
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)                     # 8 rows for f32, 16 for bf16
    cap = max(sublane, min(MAX_ROWS, _BLOCK_BYTES // (itemsize * d)) // sublane * sublane)
    out = _softmax_2d(x.reshape(rows, d), br=rows if rows <= cap else cap)
    return out.reshape(x.shape)
