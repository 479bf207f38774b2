"""RMS norm over whole-row slabs with two in-kernel sweeps over column chunks.

Grid: one "parallel" axis over row blocks of whole rows (x read from HBM once, output written
once). Inside a step:
  1. a lax.fori_loop walks the row in CHUNK-wide, 128-aligned column chunks and adds each
     chunk's row sums of x^2 (float32) to a [block_rows, 1] loop carry; the d % CHUNK columns
     after the last whole chunk are a static tail slice added once;
  2. inv_rms = rsqrt(sum / d + eps), then a second fori_loop (plus the same static tail)
     re-reads each chunk from the VMEM-resident block and writes x * inv_rms * scale.
Only [block_rows, CHUNK] float32 temporaries are live at a time, rather than f32 copies of
the whole slab, so the slab itself can be large.

Ragged edges: no padding and no masks: the loops cover only whole chunks inside d and the
static tail covers exactly the remainder (a row narrower than CHUNK is all tail). A ragged
last row block computes on rows that are never written back; few rows make one full-dim block.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6
CHUNK = 512
MAX_ROWS = 256
_BLOCK_BYTES = 4 << 20              # one input row block, in the input dtype, at most
VMEM_LIMIT_BYTES = 48 << 20


def rms_norm_kernel(x_ref, scale_ref, o_ref):
    br, d = x_ref.shape
    n_full = d // CHUNK
    tail = d % CHUNK

    def sumsq(c, acc):
        c0 = pl.multiple_of(c * CHUNK, CHUNK)
        x = x_ref[:, pl.ds(c0, CHUNK)].astype(jnp.float32)
        return acc + jnp.sum(x * x, axis=1, keepdims=True)

    acc = jax.lax.fori_loop(0, n_full, sumsq, jnp.zeros((br, 1), jnp.float32))
    if tail:
        xt = x_ref[:, n_full * CHUNK:].astype(jnp.float32)
        acc = acc + jnp.sum(xt * xt, axis=1, keepdims=True)
    inv_rms = jax.lax.rsqrt(acc * (1.0 / d) + EPS)            # [br, 1]

    def write(c, carry):
        c0 = pl.multiple_of(c * CHUNK, CHUNK)
        cols = pl.ds(c0, CHUNK)
        y = x_ref[:, cols].astype(jnp.float32) * inv_rms * scale_ref[:, cols].astype(jnp.float32)
        o_ref[:, cols] = y.astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, n_full, write, 0)
    if tail:
        t0 = n_full * CHUNK
        y = (x_ref[:, t0:].astype(jnp.float32) * inv_rms
             * scale_ref[:, t0:].astype(jnp.float32))
        o_ref[:, t0:] = y.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _rms_norm_2d(x, scale, *, br):
    rows, d = x.shape
    return pl.pallas_call(
        rms_norm_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],      # fetched once
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
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)                      # 8 rows for f32, 16 for bf16
    cap = max(sublane, min(MAX_ROWS, _BLOCK_BYTES // (itemsize * d)) // sublane * sublane)
    out = _rms_norm_2d(x.reshape(rows, d), scale, br=rows if rows <= cap else cap)
    return out.reshape(x.shape)
