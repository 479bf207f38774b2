"""Row-tiled softmax: each grid step holds a [block_rows, d] slab (whole rows) in VMEM."""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Bytes of one row block measured in float32 (the kernel computes in f32): 1 MiB keeps the
# double-buffered input and output blocks plus the f32 temporaries far below scoped VMEM.
_BLOCK_BYTES_F32 = 1 << 20
_MAX_BLOCK_ROWS = 512


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)            # [br, d]
    m = jnp.max(x, axis=-1, keepdims=True)        # subtract the row max: exp never overflows
    e = jnp.exp(x - m)
    s = jnp.sum(e, axis=-1, keepdims=True)
    o_ref[...] = (e / s).astype(o_ref.dtype)


def _block_rows(rows, d, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(_MAX_BLOCK_ROWS, _BLOCK_BYTES_F32 // (4 * d))
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
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x)


def kernel(x):
    if x.ndim < 1:
        raise ValueError("softmax needs at least one axis")
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    out = _softmax_2d(x.reshape(rows, d), br=_block_rows(rows, d, x.dtype))
    return out.reshape(x.shape)
