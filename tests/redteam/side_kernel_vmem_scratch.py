"""Cheat: the int8 matmul that does the work uses no VMEM scratch (the whole K range in one
step, no accumulator); a tiny side pallas_call stages the row scales sx through a VMEM scratch
buffer (written, read back, stored to its output), so "some kernel uses vmem_scratch".
The feature must be used by the kernels that carry the work.
task: matmul_int8_scaled  expect: missing_feature"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _stage_body(s_ref, o_ref, buf_ref):
    buf_ref[...] = s_ref[...]
    o_ref[...] = buf_ref[...]


def _stage(s):
    return pl.pallas_call(
        _stage_body,
        out_shape=jax.ShapeDtypeStruct(s.shape, s.dtype),
        scratch_shapes=[pltpu.VMEM(s.shape, s.dtype)],
    )(s)


def _matmul_body(x_ref, sx_ref, w_ref, sw_ref, o_ref):
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32).astype(jnp.float32)
    o_ref[...] = (acc * sx_ref[...].astype(jnp.float32) * sw_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def kernel(x, sx, w, sw):
    m, k = x.shape
    n = w.shape[1]
    bm, bn = min(m, 256), min(n, 256)
    sx = _stage(sx.reshape(m, 1))
    return pl.pallas_call(
        _matmul_body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), sx.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x, sx, w, sw.reshape(1, n))
