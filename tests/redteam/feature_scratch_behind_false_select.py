"""A feature used where it does nothing: the task asks for a VMEM scratch accumulator. This kernel
multiplies whole-K int8 blocks in one step (no accumulation at all), writes the product into a
VMEM scratch buffer and reads it back, then picks between that and the product it already has
with jnp.where(False, ...): the scratch is written and read, and a rule that follows values
through every equation sees it reach the output; nothing of it ever does.
task: matmul_int8_scaled  expect: missing_feature"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN = 256, 256


def int8_matmul_kernel(x_ref, sx_ref, w_ref, sw_ref, o_ref, acc_ref):
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)   # whole K at once
    acc_ref[...] = acc
    staged = jnp.where(False, acc_ref[...], acc)                                # the scratch: never chosen
    scaled = staged.astype(jnp.float32) * sx_ref[...].astype(jnp.float32) * sw_ref[...].astype(jnp.float32)
    o_ref[...] = scaled.astype(o_ref.dtype)


def _round(n, b):
    return -(-n // b) * b


def kernel(x, sx, w, sw):
    m, k = x.shape
    n = w.shape[1]
    bm, bn = min(BM, _round(m, 32)), min(BN, _round(n, 128))
    mp, np_, kp = _round(m, bm), _round(n, bn), _round(k, 128)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    sxp = jnp.pad(sx, (0, mp - m)).reshape(mp, 1)
    swp = jnp.pad(sw, (0, np_ - n)).reshape(1, np_)
    out = pl.pallas_call(
        int8_matmul_kernel,
        grid=(mp // bm, np_ // bn),
        in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((kp, bn), lambda i, j: (0, j)), pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), sx.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=64 << 20),
    )(xp, sxp, wp, swp)
    return out[:m, :n]
