"""Fused GEMM + row softmax: softmax(x @ w, axis=-1).

Each M tile owns whole output rows: grid (M tiles, K tiles), the w block spans all of N, and an
f32 VMEM accumulator [bm, N] collects x @ w over the K loop. On the last K step the epilogue
masks the padded columns, subtracts the row max, exponentiates, normalises and stores once:
the logits never reach HBM. Block sizes shrink until the pipelined blocks and the accumulator
fit a VMEM budget.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_VMEM_BUDGET = 10 * 1024 * 1024  # pipelined blocks (x2 buffers) + scratch, bytes
_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - max) == 0, never NaN


def _round_up(x, m):
    return (x + m - 1) // m * m


def _vmem_bytes(bm, bk, n, itemsize):
    return (2 * bm * bk * itemsize      # x blocks
            + 2 * bk * n * itemsize     # w blocks
            + 2 * bm * n * itemsize     # output blocks
            + bm * n * 4)               # f32 accumulator


def _choose_blocks(m, k, n, dtype):
    itemsize = jnp.dtype(dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    kp = _round_up(k, 128)
    for bm in (256, 128, 64, 32, 16, 8):
        if bm % sublane:
            continue
        bm = min(bm, _round_up(m, sublane))
        for bk in (512, 256, 128):
            bk = min(bk, kp)
            if _vmem_bytes(bm, bk, n, itemsize) <= _VMEM_BUDGET:
                return bm, bk
    raise ValueError(f"N={n} is too wide for one VMEM row block")


def gemm_softmax_kernel(x_ref, w_ref, o_ref, acc_ref, *, n_true):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(1) - 1)
    def _epilogue():
        logits = acc_ref[...]                                       # [bm, N]
        if n_true != logits.shape[1]:  # static: padded columns must get no probability
            col = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
            logits = jnp.where(col < n_true, logits, _MASK_VALUE)
        e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
        o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk"))
def _gemm_softmax(x, w, *, bm, bk):
    m, k = x.shape
    n = w.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, 128)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        functools.partial(gemm_softmax_kernel, n_true=n),
        grid=(mp // bm, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
            pl.BlockSpec((bk, np_), lambda i, kk: (kk, 0)),
        ],
        out_specs=pl.BlockSpec((bm, np_), lambda i, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, np_), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(xp, wp)
    return out[:m, :n]


def kernel(x, w):
    m, k = x.shape
    k2, n = w.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {w.shape=}")
    bm, bk = _choose_blocks(m, k, _round_up(n, 128), x.dtype)
    return _gemm_softmax(x, w, bm=bm, bk=bk)
