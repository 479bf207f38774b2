"""Tiled matmul: (M, N) output tiles, a K loop accumulating into an f32 VMEM scratch."""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Block sizes (python -m evaluator tune searches these). Blocks never exceed the aligned dims,
# so check-size grids stay small. At 4096^3, 1024-wide tiles re-read x and y 4 times (288 MiB
# moved where 192 MiB is the floor) in 64 grid steps; f32 needs 28 MiB of VMEM for them, over
# v5e's default scoped 16 MiB, hence the raised limit.
BLOCK_M = 1024
BLOCK_N = 1024
BLOCK_K = 1024
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred, align):
    """Largest useful block: the preferred size, or the whole (aligned) dim if smaller."""
    return min(preferred, _round_up(dim, align))


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def _matmul(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]
    mp, kp, np_ = _round_up(m, bm), _round_up(k, bk), _round_up(n, bn)
    # Zero padding is exact for a matmul: padded K columns contribute nothing.
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        matmul_kernel,
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),  # [bm, bk]
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),  # [bk, bn]
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(xp, yp)
    return out[:m, :n]


def kernel(x, y):
    m, k = x.shape
    k2, n = y.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {y.shape=}")
    return _matmul(x, y, bm=_block(m, BLOCK_M, 8), bn=_block(n, BLOCK_N, 128),
                   bk=_block(k, BLOCK_K, 128))
