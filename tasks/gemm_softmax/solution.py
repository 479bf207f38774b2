"""Fused GEMM + row softmax: softmax(x @ w, axis=-1).

Each M tile owns whole output rows: grid (M tiles, K tiles), the w block spans all of N, and an
f32 VMEM accumulator [bm, N] collects x @ w over the K loop. On the last K step the epilogue
subtracts the row max, exponentiates, normalises and stores once: the logits never reach HBM.

Block sizes: w is re-read once per M tile unless its block is the whole of it, and every grid
step costs a fixed overhead, so the blocks are large: 1024 rows, K in slices of 4096. At the
bench size (K = 4096) that is all of K, so the w block index never changes, w is read once
and the grid has 4 steps. N is never padded (the w and output blocks span the whole N, legal
for any width), M edges are ragged blocks (their garbage rows are never written back), only
K is zero-padded when it spans several blocks. The row block halves until its VMEM need
(double-buffered blocks, accumulator, epilogue temporaries) fits the raised VMEM limit.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the dims, so
# check-size grids stay small.
BLOCK_M = 1024
BLOCK_K = 4096
_MIB = 1 << 20
_VMEM_CAP = 96 * _MIB


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


def _vmem_bytes(bm, bk, n, itemsize):
    return (2 * (bm * bk + bk * n + bm * n) * itemsize  # double-buffered x, w, output blocks
            + 4 * bm * n * 4)                          # f32 accumulator, product, epilogue temps


def gemm_softmax_kernel(x_ref, w_ref, o_ref, acc_ref):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(1) - 1)
    def _epilogue():
        logits = acc_ref[...]                                       # [bm, N]
        e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
        o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk"))
def _gemm_softmax(x, w, *, bm, bk):
    m, k = x.shape
    n = w.shape[1]
    kp = _round_up(k, bk)  # zero K padding adds nothing to the logits
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, 0)))
    vmem = _vmem_bytes(bm, bk, n, x.dtype.itemsize)
    return pl.pallas_call(
        gemm_softmax_kernel,
        grid=(pl.cdiv(m, bm), kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
            pl.BlockSpec((bk, n), lambda i, kk: (kk, 0)),
        ],
        out_specs=pl.BlockSpec((bm, n), lambda i, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, n), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(max(vmem + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(xp, wp)


def kernel(x, w):
    m, k = x.shape
    k2, n = w.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {w.shape=}")
    itemsize = jnp.dtype(x.dtype).itemsize
    bm, bk = _block(m, BLOCK_M), _block(k, BLOCK_K)
    # Shrink the row block, then the K slice, until the blocks fit.
    while _vmem_bytes(bm, bk, n, itemsize) > _VMEM_CAP and bm > 128:
        bm = _round_up(bm // 2, 16)
    while _vmem_bytes(bm, bk, n, itemsize) > _VMEM_CAP and bk > 512:
        bk = _round_up(bk // 2, 128)
    return _gemm_softmax(x, w, bm=bm, bk=bk)
