"""softmax(x) @ v with whole rows of x: exact softmax once per row tile, kept in VMEM scratch.

Grid (M tiles "parallel", N tiles "arbitrary"). The x block is a whole row tile [bm, K] and the
v block a whole-K column slab [K, bn], so no K loop and no online rescaling: at the first N
tile of a row tile (j == 0) the kernel takes the exact row max, forms p = exp(x - max) (in v's
dtype, ready for the MXU) into a [bm, K] VMEM scratch and 1 / sum(p) into a [bm, 1] scratch.
Every N tile of that row tile then is one dot p @ v_slab, scaled by 1 / l and stored. The x block
index does not change along N, so x is read once and the softmax computed once per row.

Ragged edges: nothing is padded. K is a whole-dim block (any width is legal), so there are no
padded K columns to mask. M and N use cdiv grids: the last row tile's extra rows and the last
column slab's extra columns compute on unspecified padding, which only reaches output rows or
columns that are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 256
BLOCK_N = 256
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def softmax_pv_kernel(x_ref, v_ref, o_ref, p_ref, inv_l_ref):
    @pl.when(pl.program_id(1) == 0)
    def _softmax():
        s = x_ref[...].astype(jnp.float32)                         # [bm, K]
        p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        inv_l_ref[...] = 1.0 / jnp.sum(p, axis=-1, keepdims=True)
        p_ref[...] = p.astype(p_ref.dtype)

    acc = jnp.dot(p_ref[...], v_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = (acc * inv_l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def _softmax_matmul(x, v, *, bm, bn):
    m, k = x.shape
    n = v.shape[1]
    itemsize = x.dtype.itemsize
    kl = _round_up(k, 128)
    need = (2 * (bm * kl + kl * bn + bm * bn) * itemsize   # double-buffered x, v, out blocks
            + bm * kl * itemsize                           # p scratch
            + 3 * bm * kl * 4 + 2 * bm * bn * 4)           # f32 temporaries
    return pl.pallas_call(
        softmax_pv_kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, k), v.dtype),        # p of this row tile
                        pltpu.VMEM((bm, 1), jnp.float32)],   # 1 / row sum
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, need + need // 4)))),
    )(x, v)


def kernel(x, v):
    m, k = x.shape
    k2, n = v.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {v.shape=}")
    bm = m if m <= BLOCK_M else BLOCK_M   # whole dim, or a multiple of 16 rows
    bn = n if n <= BLOCK_N else BLOCK_N   # whole dim, or a multiple of 128 columns
    return _softmax_matmul(x, v, bm=bm, bn=bn)
