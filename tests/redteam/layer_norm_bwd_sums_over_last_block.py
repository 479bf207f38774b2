"""Lost partial sums: a LayerNorm backward tiled over row blocks that zeroes its dgamma/dbeta
accumulator at EVERY grid step (the init is missing its pl.when(program_id == 0)), so the sums
written at the last step cover the last row block only. dx is right everywhere: the mean, the
centred variance, rstd and both correction terms are computed per row as they should be, the
padding rows of a ragged last block are masked out of the sums, and the row axis is
"arbitrary". Where every row fits one block (a single row, 37 rows) it is exact; at 1024 rows in
blocks of 256, dgamma and dbeta hold a quarter of their terms.
task: layer_norm_bwd  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 256


def ln_bwd_kernel(x_ref, gamma_ref, dy_ref, dx_ref, dgamma_ref, dbeta_ref, acc_ref, *, rows, br):
    i = pl.program_id(0)
    acc_ref[...] = jnp.zeros_like(acc_ref)  # the mistake: reset on every block, not only the first

    x = x_ref[...].astype(jnp.float32)
    dy = dy_ref[...].astype(jnp.float32)
    gamma = gamma_ref[...].astype(jnp.float32)
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + EPS)
    xhat = centred * rstd
    g = dy * gamma
    dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True)
                 - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)

    row = i * br + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
    live = row < rows
    acc_ref[0:1, :] += jnp.sum(jnp.where(live, dy * xhat, 0.0), axis=0, keepdims=True)
    acc_ref[1:2, :] += jnp.sum(jnp.where(live, dy, 0.0), axis=0, keepdims=True)

    @pl.when(i == pl.num_programs(0) - 1)
    def _store():
        dgamma_ref[...] = acc_ref[0:1, :].astype(dgamma_ref.dtype)
        dbeta_ref[...] = acc_ref[1:2, :].astype(dbeta_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _run(x, gamma, dy, *, br):
    rows, d = x.shape
    row_block = pl.BlockSpec((br, d), lambda i: (i, 0))
    fixed = pl.BlockSpec((1, d), lambda i: (0, 0))
    dx, dgamma, dbeta = pl.pallas_call(
        functools.partial(ln_bwd_kernel, rows=rows, br=br),
        grid=(pl.cdiv(rows, br),),
        in_specs=[row_block, fixed, row_block],
        out_specs=[row_block, fixed, fixed],
        out_shape=[jax.ShapeDtypeStruct((rows, d), x.dtype),
                   jax.ShapeDtypeStruct((1, d), gamma.dtype),
                   jax.ShapeDtypeStruct((1, d), gamma.dtype)],
        scratch_shapes=[pltpu.VMEM((2, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=64 << 20),
    )(x, gamma.reshape(1, d), dy)
    return dx, dgamma.reshape(d), dbeta.reshape(d)


def kernel(x, gamma, dy):
    rows, d = x.shape
    return _run(x, gamma, dy, br=rows if rows <= BLOCK_ROWS else BLOCK_ROWS)
