"""Layer norm over column chunks: statistics by a chunk-wise Welford / Chan merge, then a
second sweep that normalises.

Grid: (row blocks "parallel", phase "arbitrary", column chunks "arbitrary").
  phase 0: each [block_rows, BLOCK_D] chunk computes its own exact two-pass statistics (chunk
           mean mb and centred sum of squares m2b over its n_b valid columns) and merges them
           into running (mean, M2) in float32 VMEM scratch with Chan's parallel formula:
             n = n_a + n_b, delta = mb - mean,
             mean += delta * n_b / n,  M2 += m2b + delta^2 * n_a * n_b / n.
           Every merge combines centred quantities, so neither a large row mean nor a long row
           causes the E[x^2] - E[x]^2 cancellation, and no pivot value is needed.
  phase 1: each chunk is read again and written as (x - mean) * rsqrt(M2 / d + eps) * gamma +
           beta (gamma and beta come in [1, BLOCK_D] chunks).
Only [block_rows, BLOCK_D] tiles are resident, so any d fits in VMEM (x is read twice). The
output index map parks on chunk 0 during phase 0 (nothing is written there), so each output
block is written back only after phase 1 has filled it.

Ragged edges: the last column chunk may run past d; its lanes past d are masked out of the
chunk statistics (zeroed, and n_b counts only valid columns) and the matching output columns
are never written back. A ragged last row block computes on rows that are never written back.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def layer_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref, mean_ref, m2_ref, *, d, bd):
    phase = pl.program_id(1)
    k = pl.program_id(2)
    x = x_ref[...].astype(jnp.float32)                       # [br, bd]

    @pl.when(phase == 0)
    def _stats():
        n_a = (k * bd).astype(jnp.float32)                   # columns merged so far
        if d % bd:
            valid = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < d
            n_b = jnp.minimum(bd, d - k * bd).astype(jnp.float32)
            xv = jnp.where(valid, x, 0.0)
            mb = jnp.sum(xv, axis=-1, keepdims=True) / n_b
            c = jnp.where(valid, x - mb, 0.0)
        else:
            n_b = jnp.float32(bd)
            mb = jnp.sum(x, axis=-1, keepdims=True) / n_b
            c = x - mb
        m2b = jnp.sum(c * c, axis=-1, keepdims=True)          # [br, 1]

        @pl.when(k == 0)
        def _first():
            mean_ref[...] = mb
            m2_ref[...] = m2b

        @pl.when(k > 0)
        def _merge():
            n = n_a + n_b
            delta = mb - mean_ref[...]
            mean_ref[...] += delta * (n_b / n)
            m2_ref[...] += m2b + delta * delta * (n_a * n_b / n)

    @pl.when(phase == 1)
    def _normalise():
        rstd = jax.lax.rsqrt(m2_ref[...] * (1.0 / d) + EPS)  # [br, 1]
        y = (x - mean_ref[...]) * rstd
        o_ref[...] = (y * gamma_ref[...].astype(jnp.float32)
                      + beta_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _layer_norm_2d(x, gamma, beta, *, br, bd):
    rows, d = x.shape
    vec_spec = pl.BlockSpec((1, bd), lambda i, p, k: (0, k))
    return pl.pallas_call(
        functools.partial(layer_norm_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), 2, pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, p, k: (i, k)), vec_spec, vec_spec],
        out_specs=pl.BlockSpec((br, bd), lambda i, p, k: (i, p * k)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32),     # running mean
                        pltpu.VMEM((br, 1), jnp.float32)],    # running M2
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, gamma.reshape(1, d), beta.reshape(1, d))


def kernel(x, gamma, beta):
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma and beta must have shape ({d},): {gamma.shape=} {beta.shape=}")
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    out = _layer_norm_2d(x.reshape(rows, d), gamma, beta, br=_block(rows, BLOCK_ROWS, sublane),
                         bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape)
