"""Layer norm with one-pass (shifted) row statistics and 3-D blocks over [batch, seq, d].

Statistics: a single sweep over the row computes s1 = sum(y) and s2 = sum(y^2) of the shifted
values y = x - x[:, :1] (each row's own first element), then mean = x0 + s1/d and
var = s2/d - (s1/d)^2. Variance does not change under a shift, and shifting by a value from the
row keeps (s1/d)^2 of the order of the variance, so the E[y^2] - E[y]^2 form does not lose
precision to a large row mean the way the unshifted E[x^2] - E[x]^2 would. var is clamped at
0 against rounding. The normalisation is then folded into one multiply-add per element:
out = x * a + b with a = rsqrt(var + eps) * gamma and b = beta - mean * a.

Blocking: x is viewed as [batch, seq, d] (2-D input as batch 1, more leading axes folded
into batch) and the grid is (batch, seq blocks), both "parallel". The batch axis of each
block is a squeezed `None` dim, so the kernel sees a [block_rows, d] tile without any reshape
across batches, and a ragged last seq block never mixes rows of two batch items. Its
out-of-range rows compute on padding and are never written back.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 256
VMEM_LIMIT_BYTES = 64 << 20


def layer_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)                      # [bs, d] (batch dim squeezed)
    inv_d = 1.0 / x.shape[-1]
    y = x - x[:, :1]                                        # shift by the row's first value
    m1 = jnp.sum(y, axis=-1, keepdims=True) * inv_d         # E[y]
    m2 = jnp.sum(y * y, axis=-1, keepdims=True) * inv_d     # E[y^2], same sweep
    var = jnp.maximum(m2 - m1 * m1, 0.0)                    # [bs, 1]
    mean = x[:, :1] + m1
    a = jax.lax.rsqrt(var + EPS) * gamma_ref[...].astype(jnp.float32)   # [bs, d]
    b = beta_ref[...].astype(jnp.float32) - mean * a
    o_ref[...] = (x * a + b).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bs",))
def _layer_norm_3d(x, gamma, beta, *, bs):
    b, s, d = x.shape
    row_spec = pl.BlockSpec((None, bs, d), lambda i, j: (i, j, 0))
    vec_spec = pl.BlockSpec((1, d), lambda i, j: (0, 0))    # constant index: fetched once
    return pl.pallas_call(
        layer_norm_kernel,
        grid=(b, pl.cdiv(s, bs)),
        in_specs=[row_spec, vec_spec, vec_spec],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct((b, s, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, gamma.reshape(1, d), beta.reshape(1, d))


def kernel(x, gamma, beta):
    d = x.shape[-1]
    if gamma.shape != (d,) or beta.shape != (d,):
        raise ValueError(f"gamma and beta must have shape ({d},): {gamma.shape=} {beta.shape=}")
    if x.ndim < 2:
        x3 = x.reshape(1, 1, d)
    else:
        x3 = x.reshape(math.prod(x.shape[:-2]), x.shape[-2], d)
    s = x3.shape[1]
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = max(sublane, BLOCK_ROWS // sublane * sublane)
    bs = s if s <= cap else cap                             # full dim, or sublane-aligned
    return _layer_norm_3d(x3, gamma, beta, bs=bs).reshape(x.shape)
