"""Batched matmul a[B, M, K] @ b[B, K, N]: one tiled matmul per batch entry, all in one grid.

Grid (B, M tiles, N tiles, K tiles). The batch dim is squeezed out of every block, so the
kernel body sees plain 2-D tiles. The batch, M and N axes are independent ("parallel": on
chips with two TensorCores they are split between the cores); K is last and "arbitrary",
accumulating into an f32 VMEM scratch that is cast to a.dtype at the last K step.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _round_up(x, m):
    return (x + m - 1) // m * m


def bmm_kernel(a_ref, b_ref, o_ref, acc_ref):
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(kk == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _bmm(a, b, *, bm, bn, bk):
    batch, m, k = a.shape
    n = b.shape[2]
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    # Zero padding is exact: padded K adds nothing; padded rows/cols are sliced off.
    ap = jnp.pad(a, ((0, 0), (0, mp - m), (0, kp - k)))
    bp = jnp.pad(b, ((0, 0), (0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        bmm_kernel,
        grid=(batch, mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((pl.Squeezed(), bm, bk), lambda g, i, j, kk: (g, i, kk)),
            pl.BlockSpec((pl.Squeezed(), bk, bn), lambda g, i, j, kk: (g, kk, j)),
        ],
        out_specs=pl.BlockSpec((pl.Squeezed(), bm, bn), lambda g, i, j, kk: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, mp, np_), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(ap, bp)
    return out[:, :m, :n]


def kernel(a, b):
    batch, m, k = a.shape
    batch2, k2, n = b.shape
    if batch != batch2 or k != k2:
        raise ValueError(f"shape mismatch: {a.shape=} {b.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(a.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    bm = min(512, _round_up(m, sublane))
    bn = min(512, _round_up(n, 128))
    bk = min(512, _round_up(k, 128))
    return _bmm(a, b, bm=bm, bn=bn, bk=bk)
