"""Precision below the task's dtype: an f32 matmul that quantises x and y to int8 per 128-wide
K chunk inside the kernel (a scale per row of x and per column of y in each chunk, f32),
multiplies the int8 blocks on the MXU with int32 accumulation and rescales. Per-chunk scales
keep its relative L2 error near 9e-3, under the old f32 bound of 1e-2 (an honest kernel:
2.4e-3); a float task's kernel may not multiply int8 operands (evaluator/analysis/precision.py).
task: matmul  expect: policy_violation"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 128


def _round_up(x, m):
    return (x + m - 1) // m * m


def _quantise(a, axis):
    """int8 values and their f32 scale along `axis` (the K axis of this chunk)."""
    amax = jnp.max(jnp.abs(a), axis=axis, keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    q = jnp.clip(jnp.round(a / scale), -127, 127).astype(jnp.int8)
    return q, scale


def int8_chunk_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    xq, sx = _quantise(x_ref[...].astype(jnp.float32), axis=1)  # [bm, 128], [bm, 1]
    yq, sy = _quantise(y_ref[...].astype(jnp.float32), axis=0)  # [128, bn], [1, bn]
    prod = jnp.dot(xq, yq, preferred_element_type=jnp.int32)
    acc_ref[...] += prod.astype(jnp.float32) * sx * sy

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    bm, bn = min(256, _round_up(m, 8)), min(256, _round_up(n, 128))
    mp, kp, np_ = _round_up(m, bm), _round_up(k, CHUNK), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        int8_chunk_kernel,
        grid=(mp // bm, np_ // bn, kp // CHUNK),
        in_specs=[pl.BlockSpec((bm, CHUNK), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((CHUNK, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, yp)
    return out[:m, :n]
