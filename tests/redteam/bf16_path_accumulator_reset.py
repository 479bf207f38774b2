"""Bug on the bfloat16 path only: a tiled matmul whose bfloat16 inputs take 512-deep K blocks with
the accumulator zeroed at every K step (only the last block's product survives), while float32
inputs take 1024-deep blocks with a correct accumulator. Both dtypes tile K at the bench sizes;
coverage that derives its cases from the first bench case of each gap runs a float32 case with
several K blocks and never the bfloat16 path with more than one.
task: matmul  expect: wrong_output
wrong at: m=256 k=1536 n=256 dtype=bfloat16"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN = 256, 256


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref, *, reset_every_step):
    k = pl.program_id(2)

    @pl.when((k == 0) | reset_every_step)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _round(n, b):
    return -(-n // b) * b


def kernel(x, y):
    m, kdim = x.shape
    n = y.shape[1]
    bf16 = x.dtype == jnp.bfloat16
    bk = 512 if bf16 else 1024
    bm, bn = min(BM, _round(m, 8)), min(BN, _round(n, 128))
    bk = min(bk, _round(kdim, 128))
    mp, np_, kp = _round(m, bm), _round(n, bn), _round(kdim, bk)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - kdim)))
    yp = jnp.pad(y, ((0, kp - kdim), (0, np_ - n)))
    out = pl.pallas_call(
        functools.partial(matmul_kernel, reset_every_step=bf16),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, yp)
    return out[:m, :n]
