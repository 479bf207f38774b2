"""Softmax with the row split into BLOCK_D-wide column chunks: an online (running max,
running sum) pass over the chunks, then a second sweep that writes exp(x - m) / l.

Grid: (row blocks, phase, column chunks). Row blocks are "parallel"; phase and chunks are
"arbitrary" because they carry state in VMEM scratch:
  phase 0: for each chunk, m_new = max(m, max(chunk)); l = l * exp(m - m_new) + sum(exp(chunk
           - m_new)). Rescaling the old sum by exp(m - m_new) keeps l equal to
           sum_j exp(x_j - m) over all columns seen so far, so after the last chunk m is the
           row max and l the softmax denominator (no exp ever overflows: x - m <= 0).
  phase 1: each chunk is read again and written as exp(x - m) / l.
Only [block_rows, BLOCK_D] tiles are ever resident, so any d fits in VMEM, at the price of
reading x twice. The output block index stays at chunk 0 during phase 0 (nothing is written
there), so it is only written back once phase 1 has filled it.

Ragged edges: a ragged last column chunk holds garbage past d; it is masked to -inf before the
running max/sum (exp(-inf) = 0), and the matching output columns are never written back. A
ragged last row block computes on rows that are dropped likewise.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def softmax_kernel(x_ref, o_ref, m_ref, l_ref, *, d, bd):
    phase = pl.program_id(1)
    k = pl.program_id(2)

    @pl.when((phase == 0) & (k == 0))
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    x = x_ref[...].astype(jnp.float32)                       # [br, bd]
    if d % bd:
        # Columns past d (only in the last chunk) hold undefined data: drop them.
        col = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        x = jnp.where(col < d, x, -jnp.inf)

    @pl.when(phase == 0)
    def _accumulate():
        m_old = m_ref[...]                                   # [br, 1]
        m_new = jnp.maximum(m_old, jnp.max(x, axis=-1, keepdims=True))
        # Every chunk has at least one real column, so m_new is finite and exp(m_old -
        # m_new) is exp(-inf) = 0 on the first chunk, never nan.
        l_ref[...] = (l_ref[...] * jnp.exp(m_old - m_new)
                      + jnp.sum(jnp.exp(x - m_new), axis=-1, keepdims=True))
        m_ref[...] = m_new

    @pl.when(phase == 1)
    def _write():
        inv_l = 1.0 / l_ref[...]                             # [br, 1]
        o_ref[...] = (jnp.exp(x - m_ref[...]) * inv_l).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _softmax_2d(x, *, br, bd):
    rows, d = x.shape
    return pl.pallas_call(
        functools.partial(softmax_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), 2, pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, p, k: (i, k))],
        # Phase 0 parks on chunk 0 (p * k == 0); phase 1 walks the chunks.
        out_specs=pl.BlockSpec((br, bd), lambda i, p, k: (i, p * k)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32),   # running max m
                        pltpu.VMEM((br, 1), jnp.float32)],  # running sum l
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    if x.ndim < 1:
        raise ValueError("softmax needs at least one axis")
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    br = _block(rows, BLOCK_ROWS, sublane)
    bd = _block(d, BLOCK_D, 128)
    return _softmax_2d(x.reshape(rows, d), br=br, bd=bd).reshape(x.shape)
