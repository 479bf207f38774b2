"""Fused GEMM + RMS norm over the output row: rms_norm(x @ w) * scale.

Each M tile owns whole output rows: grid (M tiles, K tiles), the w block spans all of N, and an
f32 accumulator [bm, N] collects x @ w over the K loop (the output block itself when the output
is float32, else a VMEM scratch). On the last K step the epilogue takes each row's mean square
(over the true N; padded columns are zero and add nothing), scales by rsqrt(ms + eps) and by
`scale`, and stores once: the un-normalised product never reaches HBM.

x is read once; w is re-read once per M tile, so the row block is tall (BLOCK_M = 1024: at
the 4096^3 bench size w moves 4 times, well under the compute time). vmem_limit_bytes is
raised to what the blocks need.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-6

# Block sizes (python -m evaluator tune searches these); capped at the aligned dims.
BLOCK_M = 1024
BLOCK_K = 512

_MiB = 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred, align):
    """The preferred block, or the whole (aligned) dim if that is smaller."""
    return min(preferred, _round_up(dim, align))


def _vmem_limit(bm, bk, n, itemsize, separate_acc):
    need = (2 * bm * bk * itemsize      # x blocks (double-buffered)
            + 2 * bk * n * itemsize     # w blocks
            + 2 * 16 * n * itemsize     # scale blocks (padded to a sublane tile)
            + 2 * bm * n * itemsize     # output blocks
            + 2 * bm * n * 4            # x @ w and epilogue temporaries
            + (bm * n * 4 if separate_acc else 0))
    return min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB))


def gemm_rmsnorm_kernel(x_ref, w_ref, scale_ref, o_ref, *scratch, n_true):
    acc_ref = scratch[0] if scratch else o_ref  # float32 output: accumulate in place
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(1) - 1)
    def _epilogue():
        y = acc_ref[...]                                           # [bm, N]
        ms = jnp.sum(y * y, axis=-1, keepdims=True) * (1.0 / n_true)  # [bm, 1]
        scale = scale_ref[...].astype(jnp.float32)                 # [1, N]
        o_ref[...] = (y * jax.lax.rsqrt(ms + EPS) * scale).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk"))
def _gemm_rmsnorm(x, w, scale, *, bm, bk):
    m, k = x.shape
    n = w.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, 128)
    # Zero padding: padded K adds nothing to the product, padded N columns are zero (so they add
    # nothing to the sum of squares) and are sliced off with the padded rows.
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    wp = jnp.pad(w, ((0, kp - k), (0, np_ - n)))
    sp = jnp.pad(scale, (0, np_ - n)).reshape(1, np_)
    separate_acc = x.dtype != jnp.float32
    out = pl.pallas_call(
        functools.partial(gemm_rmsnorm_kernel, n_true=n),
        grid=(mp // bm, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
            pl.BlockSpec((bk, np_), lambda i, kk: (kk, 0)),
            pl.BlockSpec((1, np_), lambda i, kk: (0, 0)),
        ],
        out_specs=pl.BlockSpec((bm, np_), lambda i, kk: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, np_), jnp.float32)] if separate_acc else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(bm, bk, np_, x.dtype.itemsize, separate_acc)),
    )(xp, wp, sp)
    return out[:m, :n]


def kernel(x, w, scale):
    m, k = x.shape
    k2, n = w.shape
    if k != k2 or scale.shape != (n,):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=} {scale.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _gemm_rmsnorm(x, w, scale, bm=_block(m, BLOCK_M, sublane), bk=_block(k, BLOCK_K, 128))
