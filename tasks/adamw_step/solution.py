"""Fused AdamW step: one pass over [block_rows, block_cols] tiles of param, grad, m and v.

Every element is independent, so the grid is 2-D over row and column blocks, both "parallel".
Each step reads one tile of the four operands, updates the moments and the weight in float32
and writes the three results. param', m' and v' alias param, m and v (input_output_aliases):
the update happens in place, as an optimizer runs it (under jit without donated inputs XLA
copies the operands first; with donation it writes into them). Only where the tiles cover the
arrays exactly, though: TPU interpret mode (jax 0.10) hands back an aliased output padded to
whole tiles, so a grid whose edge tiles overhang writes fresh outputs instead.

step arrives whole in SMEM. The bias corrections 1 - b^t are computed once per grid step on a
[1, 128] vector (exp(t * log b); the scalar unit has no transcendentals) and broadcast against
the tile as 1 / (1 - b^t).

Tiles hold up to BLOCK_ROWS x BLOCK_COLS elements (the whole extent where a dimension is
smaller); edge tiles may overhang the arrays, which is harmless for an elementwise update (the
overhang is never written back). With seven double-buffered float32 tiles of 2 MiB the default
scoped VMEM is too small, so the limit is raised to VMEM_LIMIT_BYTES.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LR = 1e-3
B1 = 0.9
B2 = 0.999
EPS = 1e-8
WEIGHT_DECAY = 0.01
BLOCK_ROWS = 256   # tune: 64, 128, 256, 512  (rows per tile, at most; a multiple of 16)
BLOCK_COLS = 2048  # tune: 512, 1024, 2048, 4096  (columns per tile, at most; a multiple of 128)
VMEM_LIMIT_BYTES = 64 << 20


def adamw_kernel(step_ref, p_ref, g_ref, m_ref, v_ref, p_out, m_out, v_out):
    t = jnp.full((1, 128), step_ref[0], jnp.int32).astype(jnp.float32)
    inv_bc1 = (1.0 / (1.0 - jnp.exp(t * math.log(B1))))[:, :1]   # [1, 1]
    inv_bc2 = (1.0 / (1.0 - jnp.exp(t * math.log(B2))))[:, :1]

    p = p_ref[...].astype(jnp.float32)
    g = g_ref[...].astype(jnp.float32)
    m = B1 * m_ref[...] + (1.0 - B1) * g
    v = B2 * v_ref[...] + (1.0 - B2) * (g * g)
    update = (m * inv_bc1) / (jnp.sqrt(v * inv_bc2) + EPS) + WEIGHT_DECAY * p
    p_out[...] = (p - LR * update).astype(p_out.dtype)
    m_out[...] = m
    v_out[...] = v


def _block(extent, cap, align):
    return extent if extent <= cap else cap // align * align


@functools.partial(jax.jit, static_argnames=("br", "bc"))
def _adamw(param, grad, m, v, step, *, br, bc):
    n, d = param.shape
    exact = n % br == 0 and d % bc == 0
    tile = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    return pl.pallas_call(
        adamw_kernel,
        grid=(pl.cdiv(n, br), pl.cdiv(d, bc)),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), tile, tile, tile, tile],
        out_specs=[tile, tile, tile],
        out_shape=[jax.ShapeDtypeStruct((n, d), param.dtype),
                   jax.ShapeDtypeStruct((n, d), jnp.float32),
                   jax.ShapeDtypeStruct((n, d), jnp.float32)],
        # In place: param -> param', m -> m', v -> v' (operand 0 is step).
        input_output_aliases={1: 0, 3: 1, 4: 2} if exact else {},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(step, param, grad, m, v)


def kernel(param, grad, m, v, step):
    if param.ndim != 2 or grad.shape != param.shape or m.shape != param.shape or v.shape != param.shape:
        raise ValueError(f"expected param, grad, m, v of one [n, d] shape; got {param.shape=}, "
                         f"{grad.shape=}, {m.shape=}, {v.shape=}")
    n, d = param.shape
    sublane = 8 * max(1, 4 // jnp.dtype(param.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _adamw(param, grad, m.astype(jnp.float32), v.astype(jnp.float32),
                  step.reshape(1).astype(jnp.int32),
                  br=_block(n, BLOCK_ROWS, sublane), bc=_block(d, BLOCK_COLS, 128))
