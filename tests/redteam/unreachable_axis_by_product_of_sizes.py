"""A path no check case can reach: a matmul that runs whole arrays as one block unless
m * k * n reaches 1.2e10, and then tiles them in 512-blocks with its accumulator zeroed once for
the whole grid (so every output block after the first starts from the previous block's sum). No
check size, nor any size that grows one dimension, or all but one, of a check case to its bench
value, reaches that product (the largest, 4096 x 512 x 4096, is 8.6e9); both bench sizes are
over it. Graded correct, it would teach that the tiled path is right.
task: matmul  expect: unverified
wrong at: m=2304 k=2304 n=2304"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 512


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when((i == 0) & (j == 0) & (k == 0))
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
    tiled = m * kdim * n >= 12_000_000_000
    bm = BLOCK if tiled else _round(m, 8)
    bn = BLOCK if tiled else _round(n, 128)
    bk = BLOCK if tiled else _round(kdim, 128)
    mp, np_, kp = _round(m, bm), _round(n, bn), _round(kdim, bk)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - kdim)))
    yp = jnp.pad(y, ((0, kp - kdim), (0, np_ - n)))
    out = pl.pallas_call(
        matmul_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=64 << 20),
    )(xp, yp)
    return out[:m, :n]
