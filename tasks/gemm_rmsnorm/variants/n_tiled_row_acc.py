"""Fused GEMM + RMS norm with N-tiled weight blocks feeding a full-row accumulator.

The norm needs whole output rows, so an M tile must see every column of x @ w before it can
store anything. Here the weights are nevertheless streamed in small [bk, bn] tiles: the grid
is (M tiles, K tiles, N tiles) with N innermost, and a [bm, Np] f32 VMEM accumulator holds the
whole row block. Step (i, kk, j) adds x[i, kk] @ w[kk, j] into the accumulator's column slice
j (a lane-aligned dynamic slice); the x block's index does not depend on j, so it stays in
VMEM across the N sweep. After the last (kk, j) step the epilogue takes each row's mean square
over the true N, scales by rsqrt(ms + eps) and by `scale`, and stores the [bm, Np] output
block once (its index depends only on i, so it stays resident across the K and N axes).

Compared with a w block spanning all of N, VMEM holds only a [bk, bn] weight tile (double
buffered) instead of [bk, N], so wide layers fit with a long K block.

Padding: K and N are zero-padded to whole blocks (zero columns add nothing to the product or
to the sum of squares; the mean divides by the true N), M uses a `pl.cdiv` grid (rows past
the edge are independent and never written back). Padded output columns are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6

# Block sizes (python -m evaluator tune searches these). BLOCK_M rows per accumulator,
# weight tiles BLOCK_K x BLOCK_N. Clamped to the (aligned) dims.
BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 1024
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def gemm_rmsnorm_kernel(x_ref, w_ref, scale_ref, o_ref, acc_ref, *, n_true, bn):
    kk = pl.program_id(1)
    j = pl.program_id(2)
    last_k = pl.num_programs(1) - 1
    last_j = pl.num_programs(2) - 1

    @pl.when((kk == 0) & (j == 0))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    cols = pl.ds(pl.multiple_of(j * bn, bn), bn)   # this step's column slice of the row block
    acc_ref[:, cols] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when((kk == last_k) & (j == last_j))
    def _normalise():
        y = acc_ref[...]                                               # [bm, Np] f32
        ms = jnp.sum(y * y, axis=-1, keepdims=True) * (1.0 / n_true)   # [bm, 1]
        scale = scale_ref[...].astype(jnp.float32)                     # [1, Np]
        o_ref[...] = (y * jax.lax.rsqrt(ms + EPS) * scale).astype(o_ref.dtype)


def _vmem_limit(bm, bn, bk, np_, itemsize):
    """Double-buffered x, w and output blocks, the scale row, the f32 row accumulator, the
    product and epilogue temporaries, plus headroom; at least 32 MiB, at most 100 MiB."""
    need = (2 * (bm * bk + bk * bn + 16 * np_ + bm * np_) * itemsize
            + bm * np_ * 4 + 2 * bm * np_ * 4 + bm * bn * 4)
    return int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _gemm_rmsnorm(x, w, scale, *, bm, bn, bk):
    m, k = x.shape
    n = w.shape[1]
    kp, np_ = _round_up(k, bk), _round_up(n, bn)
    xp = jnp.pad(x, ((0, 0), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    sp = jnp.pad(scale, (0, np_ - n)).reshape(1, np_)
    out = pl.pallas_call(
        functools.partial(gemm_rmsnorm_kernel, n_true=n, bn=bn),
        grid=(pl.cdiv(m, bm), kp // bk, np_ // bn),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, kk, j: (i, kk)),   # resident across j
            pl.BlockSpec((bk, bn), lambda i, kk, j: (kk, j)),   # one weight tile per step
            pl.BlockSpec((1, np_), lambda i, kk, j: (0, 0)),    # whole scale row, fetched once
        ],
        out_specs=pl.BlockSpec((bm, np_), lambda i, kk, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, np_), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bn, bk, np_, x.dtype.itemsize)),
    )(xp, wp, sp)
    return out[:, :n]


def kernel(x, w, scale):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or scale.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=} {scale.shape=}")
    bm = m if m <= BLOCK_M else BLOCK_M                  # whole dim, or an aligned block
    bn = min(BLOCK_N, _round_up(n, 128))
    bk = min(BLOCK_K, _round_up(k, 128))
    return _gemm_rmsnorm(x, w, scale, bm=bm, bn=bn, bk=bk)
