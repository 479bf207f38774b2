"""An unfused pre-norm MLP block: three kernels with the hidden layer in HBM between them.

kernel 1 normalises the rows (rms_norm(x) * g, float32); kernel 2 is a tiled matmul
xn @ w1 whose [M, F] float32 result goes to HBM; gelu_tanh runs in XLA on it (element-wise
glue, a few FLOPs per hidden unit); kernel 3 is the same matmul h @ w2, and XLA adds the
residual. Slower than the fused solution (the hidden layer makes a round trip through HBM),
but an ordinary design: the grader must accept it. Its [M, F] float32 intermediate is at
most 0.9x the case's inputs and outputs (evaluator/analysis/intermediates.py refuses over 2x).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6


def _round_up(x, m):
    return (x + m - 1) // m * m


def _lane_block(n):
    """The largest of 512, 256, 128 that divides n (a multiple of 128)."""
    return next(b for b in (512, 256, 128) if n % b == 0)


def norm_kernel(x_ref, g_ref, o_ref, *, d_true):
    x = x_ref[...].astype(jnp.float32)                                   # [bm, dp]
    ms = jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / d_true)         # [bm, 1]
    o_ref[...] = x * lax.rsqrt(ms + EPS) * g_ref[...].astype(jnp.float32)


def matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    a, b = a_ref[...], b_ref[...].astype(jnp.float32)                    # [bm, bk], [bk, bn]
    acc_ref[...] += jnp.dot(a, b, precision=lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...]


def _matmul(a, b, bm):
    """a [mp, kp] float32 @ b [kp, np] -> [mp, np] float32; every dim already padded."""
    mp, kp = a.shape
    n = b.shape[1]
    bk, bn = _lane_block(kp), _lane_block(n)
    return pl.pallas_call(
        matmul_kernel,
        grid=(mp // bm, n // bn, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(a, b)


def kernel(x, g, w1, w2):
    m, d = x.shape
    f = w1.shape[1]
    bm = min(256, _round_up(m, 8))
    mp, dp, fp = _round_up(m, bm), _round_up(d, 128), _round_up(f, 128)
    x_p = jnp.pad(x, ((0, mp - m), (0, dp - d)))
    g_p = jnp.pad(g, (0, dp - d)).reshape(1, dp)
    xn = pl.pallas_call(
        lambda x_ref, g_ref, o_ref: norm_kernel(x_ref, g_ref, o_ref, d_true=d),
        grid=(mp // bm,),
        in_specs=[pl.BlockSpec((bm, dp), lambda i: (i, 0)), pl.BlockSpec((1, dp), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bm, dp), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, dp), jnp.float32),
    )(x_p, g_p)                                                           # [mp, dp] f32
    pre = _matmul(xn, jnp.pad(w1, ((0, dp - d), (0, fp - f))), bm)        # [mp, fp] f32, in HBM
    h = 0.5 * pre * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre ** 3)))
    y = _matmul(h, jnp.pad(w2, ((0, fp - f), (0, dp - d))), bm)           # [mp, dp] f32
    return (x.astype(jnp.float32) + y[:m, :d]).astype(x.dtype)
