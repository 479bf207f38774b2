"""Row-tiled softmax: each grid step holds a [block_rows, d] slab (whole rows) in VMEM.

Grid: one "parallel" axis over row blocks; x is read once and the output written once.
Blocks are large (up to BLOCK_ROWS rows and _BLOCK_BYTES of input) because at bench sizes the
fixed cost per grid step, not bandwidth, is what small blocks lose: bf16 512 x 4096 blocks give
16 steps over 8192 rows. The double-buffered blocks plus the f32 temporaries of the slab need
more than the default scoped VMEM, so the limit is raised to VMEM_LIMIT_BYTES.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 512
_BLOCK_BYTES = 4 << 20              # one input row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 64 << 20


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)            # [br, d]
    m = jnp.max(x, axis=-1, keepdims=True)        # subtract the row max: exp never overflows
    e = jnp.exp(x - m)
    s = jnp.sum(e, axis=-1, keepdims=True)
    o_ref[...] = (e / s).astype(o_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(dtype).itemsize * d))
    cap = max(sublane, cap // sublane * sublane)
    # A block equal to the full row count is always legal; otherwise a multiple of the
    # sublane tile with a ragged last block (its out-of-range rows are never written back).
    return rows if rows <= cap else cap


@functools.partial(jax.jit, static_argnames=("br",))
def _softmax_2d(x, *, br):
    rows, d = x.shape
    return pl.pallas_call(
        softmax_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    if x.ndim < 1:
        raise ValueError("softmax needs at least one axis")
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    out = _softmax_2d(x.reshape(rows, d), br=_block_rows(rows, d, x.dtype))
    return out.reshape(x.shape)
