"""Weight decay without the learning rate: an AdamW step that applies the decoupled decay as
param * (1 - weight_decay), where AdamW (optax.adamw, torch.optim.AdamW) shrinks the weight by
lr * weight_decay, param * (1 - lr * weight_decay). Everything else is right: both moments,
their bias corrections at step t, eps outside the square root, the Adam update scaled by lr,
float32 math, the tiles and the in-place aliasing. The decay is 1000 times too strong: every
weight moves by 1% of itself (0.01 * param) on top of an update of about 3%, far outside the
float32 bound (relative L2 5e-4); m' and v' are exact.
task: adamw_step  expect: wrong_output"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LR, B1, B2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.999, 1e-8, 0.01
BLOCK_ROWS = 256
BLOCK_COLS = 2048


def adamw_kernel(step_ref, p_ref, g_ref, m_ref, v_ref, p_out, m_out, v_out):
    t = jnp.full((1, 128), step_ref[0], jnp.int32).astype(jnp.float32)
    inv_bc1 = (1.0 / (1.0 - jnp.exp(t * math.log(B1))))[:, :1]
    inv_bc2 = (1.0 / (1.0 - jnp.exp(t * math.log(B2))))[:, :1]
    p = p_ref[...].astype(jnp.float32)
    g = g_ref[...].astype(jnp.float32)
    m = B1 * m_ref[...] + (1.0 - B1) * g
    v = B2 * v_ref[...] + (1.0 - B2) * g * g
    adam = (m * inv_bc1) / (jnp.sqrt(v * inv_bc2) + EPS)
    p_out[...] = (p * (1.0 - WEIGHT_DECAY) - LR * adam).astype(p_out.dtype)  # the mistake
    m_out[...] = m
    v_out[...] = v


@functools.partial(jax.jit, static_argnames=("br", "bc"))
def _run(param, grad, m, v, step, *, br, bc):
    n, d = param.shape
    tile = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    exact = n % br == 0 and d % bc == 0
    return pl.pallas_call(
        adamw_kernel,
        grid=(pl.cdiv(n, br), pl.cdiv(d, bc)),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), tile, tile, tile, tile],
        out_specs=[tile, tile, tile],
        out_shape=[jax.ShapeDtypeStruct((n, d), param.dtype),
                   jax.ShapeDtypeStruct((n, d), jnp.float32),
                   jax.ShapeDtypeStruct((n, d), jnp.float32)],
        input_output_aliases={1: 0, 3: 1, 4: 2} if exact else {},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=64 << 20),
    )(step, param, grad, m, v)


def kernel(param, grad, m, v, step):
    n, d = param.shape
    br = n if n <= BLOCK_ROWS else BLOCK_ROWS
    bc = d if d <= BLOCK_COLS else BLOCK_COLS
    return _run(param, grad, m, v, step.reshape(1), br=br, bc=bc)
