"""Log-softmax in ONE pallas_call over column chunks: an online logsumexp sweep, then a write
sweep, with the row statistics kept in VMEM scratch between them.

Grid: (row blocks "parallel", phase "arbitrary", column chunks "arbitrary").
  phase 0: for each [block_rows, BLOCK_D] chunk, m_new = max(m, max(chunk)) and
           l = l * exp(m - m_new) + sum(exp(chunk - m_new)); after the last chunk m is the row
           max and l = sum_j exp(x_j - m) (exp never overflows: its argument is <= 0).
  phase 1: each chunk is read again and written as x - m - log(l), with log(l) computed once
           per row block (at the first chunk of phase 1) into scratch.
Unlike a whole-row kernel, only [block_rows, BLOCK_D] tiles are resident, so any d fits in
VMEM; unlike a separate logsumexp call, the statistics never leave VMEM. The output index map
parks on chunk 0 during phase 0 (nothing is written there), so each output block is written
back only once phase 1 has filled it.

Ragged edges: a ragged last column chunk holds undefined data past d; it is masked to -inf
before the max/sum (exp(-inf) = 0; every chunk has at least one real column, so the running
max stays finite), and those output columns are never written back. A ragged last row block
computes on rows that are dropped likewise.
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


def log_softmax_kernel(x_ref, o_ref, m_ref, l_ref, *, d, bd):
    phase = pl.program_id(1)
    k = pl.program_id(2)
    x = x_ref[...].astype(jnp.float32)                       # [br, bd]

    @pl.when(phase == 0)
    def _accumulate():
        @pl.when(k == 0)
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

        xm = x
        if d % bd:
            col = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
            xm = jnp.where(col < d, x, -jnp.inf)
        m_old = m_ref[...]
        m_new = jnp.maximum(m_old, jnp.max(xm, axis=-1, keepdims=True))
        l_ref[...] = (l_ref[...] * jnp.exp(m_old - m_new)
                      + jnp.sum(jnp.exp(xm - m_new), axis=-1, keepdims=True))
        m_ref[...] = m_new

    @pl.when(phase == 1)
    def _write():
        @pl.when(k == 0)
        def _fold():                                         # m_ref := m + log(l), once
            m_ref[...] = m_ref[...] + jnp.log(l_ref[...])

        o_ref[...] = (x - m_ref[...]).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _log_softmax_2d(x, *, br, bd):
    rows, d = x.shape
    return pl.pallas_call(
        functools.partial(log_softmax_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), 2, pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, p, k: (i, k))],
        out_specs=pl.BlockSpec((br, bd), lambda i, p, k: (i, p * k)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32),   # running max, then lse
                        pltpu.VMEM((br, 1), jnp.float32)],  # running sum
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    out = _log_softmax_2d(x.reshape(rows, d), br=_block(rows, BLOCK_ROWS, sublane),
                          bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape)
