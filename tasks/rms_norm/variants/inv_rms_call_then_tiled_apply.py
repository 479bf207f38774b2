"""RMS norm as two pallas_calls: a column-chunked inverse-RMS reduction, then a 2-D tiled apply.

1. reduction, grid (row blocks "parallel", column chunks "arbitrary"): each step adds the row
   sums of x^2 (float32) of one [BLOCK_ROWS, BLOCK_D] tile into a float32 [rows, 1] output
   block that stays resident across the chunks and is its own accumulator (seeded at the first
   chunk, updated in place after); at the last chunk it is turned in place into
   inv_rms = rsqrt(sum / d + eps). No VMEM scratch.
2. apply, a 2-D "parallel" grid of tiles: out = x * inv_rms * scale, each tile needing only
   its rows' inv_rms block and its columns' scale chunk.
Neither call keeps a whole row in VMEM, so any d fits; x is read twice and a [rows] f32
vector makes a round trip through HBM.

Ragged edges: lanes past d in a ragged last chunk hold undefined data and are masked out of
the sum of squares with a column iota in call 1 (the mean still divides by the true d). In
call 2, and for ragged row blocks in call 1, out-of-range elements compute on padding and are
never written back.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20


def inv_rms_kernel(x_ref, inv_ref, *, d, bd):
    k = pl.program_id(1)
    x = x_ref[...].astype(jnp.float32)                       # [br, bd]
    if d % bd:
        valid = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < d
        x = jnp.where(valid, x, 0.0)
    ss = jnp.sum(x * x, axis=1, keepdims=True)               # [br, 1]

    @pl.when(k == 0)
    def _seed():
        inv_ref[...] = ss

    @pl.when(k > 0)
    def _add():
        inv_ref[...] += ss

    @pl.when(k == pl.num_programs(1) - 1)
    def _finish():
        inv_ref[...] = jax.lax.rsqrt(inv_ref[...] * (1.0 / d) + EPS)


def apply_kernel(x_ref, inv_ref, scale_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.float32) * inv_ref[...]
                  * scale_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _rms_norm_2d(x, scale, *, br, bd):
    rows, d = x.shape
    grid = (pl.cdiv(rows, br), pl.cdiv(d, bd))
    tile = pl.BlockSpec((br, bd), lambda i, k: (i, k))
    row_vec = pl.BlockSpec((br, 1), lambda i, k: (i, 0))
    inv_rms = pl.pallas_call(
        functools.partial(inv_rms_kernel, d=d, bd=bd),
        grid=grid,
        in_specs=[tile],
        out_specs=row_vec,
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return pl.pallas_call(
        apply_kernel,
        grid=grid,
        in_specs=[tile, row_vec, pl.BlockSpec((1, bd), lambda i, k: (0, k))],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, inv_rms, scale.reshape(1, d))


def kernel(x, scale):
    d = x.shape[-1]
    if scale.shape != (d,):
        raise ValueError(f"scale must have shape ({d},), got {scale.shape}")
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    out = _rms_norm_2d(x.reshape(rows, d), scale, br=_block(rows, BLOCK_ROWS, sublane),
                       bd=_block(d, BLOCK_D, 128))
    return out.reshape(x.shape)
