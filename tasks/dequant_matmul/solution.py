"""Weight-only int8 matmul: x @ (wq * scales) with the dequantisation inside the kernel.

Grid (M tiles, N tiles, K tiles). The int8 weight tile is converted to x.dtype in VMEM (exact:
int8 values are integers below 2^8) and multiplied on the MXU into an f32 accumulator. A
per-column scale commutes with the sum over K, so it is applied once in the epilogue:
x @ (wq * s) = (x @ wq) * s. The weights travel from HBM as int8; no dequantised copy exists.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def dequant_matmul_kernel(x_ref, wq_ref, scales_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = wq_ref[...].astype(jnp.float32).astype(x_ref.dtype)   # [bk, bn], exact
    acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] * scales_ref[...]).astype(o_ref.dtype)   # [bm, bn] * [1, bn]


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _dequant_matmul(x, wq, scales, *, bm, bn, bk):
    m, k = x.shape
    n = wq.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(wq, ((0, kp - k), (0, np_ - n)))
    sp = jnp.pad(scales.astype(jnp.float32), (0, np_ - n)).reshape(1, np_)
    out = pl.pallas_call(
        dequant_matmul_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(xp, wp, sp)
    return out[:m, :n]


def kernel(x, wq, scales):
    m, k = x.shape
    k2, n = wq.shape
    if k != k2 or scales.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {wq.shape=} {scales.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(256, _round_up(m, sublane))
    bn = min(256, _round_up(n, 128))
    bk = min(512, _round_up(k, 128))   # a multiple of 32: whole int8 sublane tiles
    return _dequant_matmul(x, wq, scales, bm=bm, bn=bn, bk=bk)
