"""Row-tiled RMS norm: each grid step normalises a [block_rows, d] slab of whole rows.

Grid: one "parallel" axis over row blocks; x is read once, the output written once, scale is a
[1, d] block with a constant index (fetched once). Blocks are large (up to BLOCK_ROWS rows and _BLOCK_BYTES per input block, in the input dtype)
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
_BLOCK_BYTES = 4 << 20              # one input row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 64 << 20


def rms_norm_kernel(x_ref, scale_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)                  # [br, d]
    ms = jnp.mean(x * x, axis=-1, keepdims=True)        # [br, 1]
    scale = scale_ref[...].astype(jnp.float32)          # [1, d]
    o_ref[...] = (x * jax.lax.rsqrt(ms + EPS) * scale).astype(o_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(dtype).itemsize * d))
    cap = max(sublane, cap // sublane * sublane)
    # A block equal to the full row count is always legal; otherwise a multiple of the
    # sublane tile with a ragged last block (its out-of-range rows are never written back).
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _rms_norm_2d(x, scale, *, br):
    rows, d = x.shape
    return pl.pallas_call(
        rms_norm_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[
            pl.BlockSpec((br, d), lambda i: (i, 0)),
            pl.BlockSpec((1, d), lambda i: (0, 0)),   # same block every step: fetched once
        ],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, scale.reshape(1, d))


def kernel(x, scale):
    d = x.shape[-1]
    if scale.shape != (d,):
        raise ValueError(f"scale must have shape ({d},), got {scale.shape}")
    rows = math.prod(x.shape[:-1])
    out = _rms_norm_2d(x.reshape(rows, d), scale, br=_block_rows(rows, d, x.dtype))
    return out.reshape(x.shape)
