"""RMS norm with the row split into BLOCK_D-wide column chunks and two sweeps per row block.

Grid: (row blocks "parallel", phase "arbitrary", column chunks "arbitrary").
  phase 0: each chunk adds sum(x^2) of its columns to a [block_rows, 1] float32 VMEM scratch
           accumulator (zeroed at the first chunk);
  phase 1: each chunk is read again and written as x * rsqrt(acc / d + eps) * scale.
Only [block_rows, BLOCK_D] tiles are resident, so any d fits in VMEM, at the price of reading x
twice. The output index map parks on chunk 0 during phase 0 (nothing is written to it), so each
output block is written back only after phase 1 has filled it.

Ragged edges are handled by zero padding outside the kernel instead of in-kernel masks: d is
padded to a multiple of the chunk and rows to a multiple of the row block. Zero columns add
nothing to the sum of squares (the mean still divides by the true d) and zero rows give 0
outputs with no nan (rsqrt(0 + eps) is finite); the padding is sliced off afterwards.
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


def rms_norm_kernel(x_ref, scale_ref, o_ref, acc_ref, *, d):
    phase = pl.program_id(1)
    k = pl.program_id(2)
    x = x_ref[...].astype(jnp.float32)                   # [br, bd]

    @pl.when((phase == 0) & (k == 0))
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(phase == 0)
    def _accumulate():
        acc_ref[...] += jnp.sum(x * x, axis=-1, keepdims=True)

    @pl.when(phase == 1)
    def _write():
        inv_rms = jax.lax.rsqrt(acc_ref[...] * (1.0 / d) + EPS)   # [br, 1]
        o_ref[...] = (x * inv_rms * scale_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _block(n, cap, align):
    """(block, padded n): the dim rounded up to its alignment when it fits in one block,
    else cap rounded down to the alignment with n padded to a multiple of it."""
    cap = max(align, cap // align * align)
    n_aligned = pl.cdiv(n, align) * align
    if n_aligned <= cap:
        return n_aligned, n_aligned
    return cap, pl.cdiv(n, cap) * cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _rms_norm_2d(x, scale, *, br, bd):
    rows, d = x.shape
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    br, rows_p = _block(rows, br, sublane)
    bd, d_p = _block(d, bd, 128)
    xp = jnp.pad(x, ((0, rows_p - rows), (0, d_p - d)))
    sp = jnp.pad(scale, (0, d_p - d)).reshape(1, d_p)
    out = pl.pallas_call(
        functools.partial(rms_norm_kernel, d=d),
        grid=(rows_p // br, 2, d_p // bd),
        in_specs=[pl.BlockSpec((br, bd), lambda i, p, k: (i, k)),
                  pl.BlockSpec((1, bd), lambda i, p, k: (0, k))],
        out_specs=pl.BlockSpec((br, bd), lambda i, p, k: (i, p * k)),
        out_shape=jax.ShapeDtypeStruct((rows_p, d_p), x.dtype),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32)],    # per-row sum of squares
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(xp, sp)
    return out[:rows, :d]


def kernel(x, scale):
    d = x.shape[-1]
    if scale.shape != (d,):
        raise ValueError(f"scale must have shape ({d},), got {scale.shape}")
    rows = math.prod(x.shape[:-1])
    out = _rms_norm_2d(x.reshape(rows, d), scale, br=BLOCK_ROWS, bd=BLOCK_D)
    return out.reshape(x.shape)
