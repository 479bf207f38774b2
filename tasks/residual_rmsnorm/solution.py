"""Fused residual add + RMS norm: returns (rms_norm(x + residual) * scale, x + residual).

Row-tiled: each grid step reads a [block_rows, d] slab of x and of residual, forms the sum in
float32, writes it out (the new residual stream) and normalises the same f32 sum in VMEM, so
the sum is read from HBM zero times and written once.

Blocks are large (up to BLOCK_ROWS rows and _BLOCK_BYTES per input block, in the input dtype)
because at bench sizes the fixed cost per grid step, not bandwidth, is what small blocks lose:
bf16 [512, 4096] blocks give 32 steps over 16384 rows. The double-buffered blocks plus the f32
temporaries of the slab need more than the default scoped VMEM, so the limit is raised to
VMEM_LIMIT_BYTES.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 512
_BLOCK_BYTES = 4 << 20              # one row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 80 << 20


def residual_rmsnorm_kernel(x_ref, r_ref, scale_ref, o_ref, sum_ref):
    s = x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)   # [br, d]
    sum_ref[...] = s.astype(sum_ref.dtype)
    ms = jnp.mean(s * s, axis=-1, keepdims=True)
    scale = scale_ref[...].astype(jnp.float32)                             # [1, d]
    o_ref[...] = (s * jax.lax.rsqrt(ms + EPS) * scale).astype(o_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(dtype).itemsize * d))
    cap = max(sublane, cap // sublane * sublane)
    # The full row count is always a legal block; otherwise a ragged last block, whose
    # out-of-range rows are never written back.
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _residual_rmsnorm_2d(x, r, scale, *, br):
    rows, d = x.shape
    row_spec = pl.BlockSpec((br, d), lambda i: (i, 0))
    shape = jax.ShapeDtypeStruct((rows, d), x.dtype)
    return pl.pallas_call(
        residual_rmsnorm_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_spec, row_spec, pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=[row_spec, row_spec],
        out_shape=[shape, shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, r, scale.reshape(1, d))


def kernel(x, residual, scale):
    d = x.shape[-1]
    if residual.shape != x.shape or scale.shape != (d,):
        raise ValueError(f"shape mismatch: {x.shape=} {residual.shape=} {scale.shape=}")
    rows = math.prod(x.shape[:-1])
    out, total = _residual_rmsnorm_2d(x.reshape(rows, d), residual.reshape(rows, d), scale,
                                      br=_block_rows(rows, d, x.dtype))
    return out.reshape(x.shape), total.reshape(x.shape)
