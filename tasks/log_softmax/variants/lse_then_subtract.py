"""Log-softmax as two pallas_calls: a row log-sum-exp reduction, then an elementwise subtract.

1. lse kernel, grid (row blocks "parallel", column chunks "arbitrary"): an online reduction
   over BLOCK_D-wide chunks keeps a running max m and a running sum l of exp(x - m) in VMEM
   scratch (l is rescaled by exp(m_old - m_new) whenever the max grows, so it always equals
   the sum over the columns seen so far relative to the current max). The last chunk writes
   lse = m + log(l) as a [rows, 1] float32 array.
2. subtract kernel, a 2-D "parallel" grid of [BLOCK_ROWS, BLOCK_D] tiles: out = x - lse.
   log_softmax(x) = x - logsumexp(x) exactly, and the tile needs only its rows' lse values.

Unlike a whole-row kernel, neither call keeps a full row in VMEM, so any d fits; x is read
twice and the small lse array makes a round trip through HBM.

Ragged edges: columns past d in the last chunk are masked to -inf before the reduction
(exp(-inf) = 0). In the subtract kernel out-of-range rows/columns compute on padding and are
never written back, so no mask is needed there.
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


def lse_kernel(x_ref, lse_ref, m_ref, l_ref, *, d, bd):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    x = x_ref[...].astype(jnp.float32)                         # [br, bd]
    if d % bd:
        col = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        x = jnp.where(col < d, x, -jnp.inf)

    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, jnp.max(x, axis=-1, keepdims=True))  # finite: >= 1 real column
    l_ref[...] = (l_ref[...] * jnp.exp(m_old - m_new)
                  + jnp.sum(jnp.exp(x - m_new), axis=-1, keepdims=True))
    m_ref[...] = m_new

    @pl.when(k == pl.num_programs(1) - 1)
    def _finish():
        lse_ref[...] = m_ref[...] + jnp.log(l_ref[...])


def subtract_kernel(x_ref, lse_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.float32) - lse_ref[...]).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _log_softmax_2d(x, *, br, bd):
    rows, d = x.shape
    grid = (pl.cdiv(rows, br), pl.cdiv(d, bd))
    tile = pl.BlockSpec((br, bd), lambda i, k: (i, k))
    row_vec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))
    lse = pl.pallas_call(
        functools.partial(lse_kernel, d=d, bd=bd),
        grid=grid,
        in_specs=[tile],
        out_specs=row_vec,                  # resident across k, written at the last chunk
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32), pltpu.VMEM((br, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return pl.pallas_call(
        subtract_kernel,
        grid=grid,
        in_specs=[tile, row_vec],           # lse block is re-used while k walks the columns
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, lse)


def kernel(x):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    out = _log_softmax_2d(x.reshape(rows, d), br=_block(rows, BLOCK_ROWS, sublane),
                          bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape)
