"""softmax(x @ w) with an online softmax over column blocks and whole-K operands.

Grid (M tiles "parallel", N blocks "arbitrary"). The x block is a whole row tile [bm, K] (its
index does not change along N, so it is read once) and the w block a whole-K column slab
[K, bn], so each step computes one finished logit tile [bm, bn] with a single dot: no K loop
and no logit accumulator. Along N the kernel keeps the running row max m and running sum l
(rescaled by exp(m_old - m_new) whenever the max grows) and stores e = exp(logit - m_new),
taken against the max *as of that block*, into a [num_blocks, bm, bn] f32 VMEM scratch, along
with that max in a [num_blocks, bm, 1] scratch. Each logit is exponentiated exactly once. After
the last block every stored block is rescaled by exp(m_block - m_final) / l_final and written
into the [bm, N] output block, which spans the whole row and goes to HBM once.

Ragged edges: nothing is padded in the wrapper. K and N are whole-dim blocks on x and the
output. M and the w column slabs use cdiv grids: columns past N in the last slab (unspecified
padding, possibly NaN) are replaced by -1e30 with a select before the statistics, so they get
no mass, and are never copied into the output; extra rows of the last row tile only reach
output rows that are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30

BLOCK_M = 256
BLOCK_N = 256
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def online_kernel(x_ref, w_ref, o_ref, e_ref, mh_ref, m_ref, l_ref, *, n_true):
    j = pl.program_id(1)
    nb, _, bn = e_ref.shape

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)

    s = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)    # [bm, bn]
    if n_true % bn:
        col = j * bn + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(col < n_true, s, _MASK_VALUE)
    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
    e = jnp.exp(s - m_new)
    l_ref[...] = jnp.exp(m_old - m_new) * l_ref[...] + jnp.sum(e, axis=-1, keepdims=True)
    m_ref[...] = m_new
    e_ref[j] = e
    mh_ref[j] = m_new

    @pl.when(j == nb - 1)
    def _emit():
        m_final = m_ref[...]
        inv_l = 1.0 / l_ref[...]
        for b in range(nb):   # static: every block's columns are a static slice of the row
            width = min(bn, n_true - b * bn)
            scaled = e_ref[b] * (jnp.exp(mh_ref[b] - m_final) * inv_l)
            o_ref[:, b * bn:b * bn + width] = scaled[:, :width].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bn"))
def _gemm_softmax(x, w, *, bm, bn):
    m, k = x.shape
    n = w.shape[1]
    nb = pl.cdiv(n, bn)
    itemsize = x.dtype.itemsize
    kl = _round_up(k, 128)
    need = (2 * (bm * kl + kl * bn + bm * _round_up(n, 128)) * itemsize   # x, w, out blocks
            + nb * bm * bn * 4 + nb * bm * 128 * 4                        # e and max history
            + 4 * bm * bn * 4)                                            # f32 temporaries
    return pl.pallas_call(
        functools.partial(online_kernel, n_true=n),
        grid=(pl.cdiv(m, bm), nb),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, n), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((nb, bm, bn), jnp.float32),   # exp(logit - max at block)
                        pltpu.VMEM((nb, bm, 1), jnp.float32),    # max at each block
                        pltpu.VMEM((bm, 1), jnp.float32),        # running max
                        pltpu.VMEM((bm, 1), jnp.float32)],       # running sum
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=int(min(100 * _MiB, max(32 * _MiB, need + need // 4)))),
    )(x, w)


def kernel(x, w):
    m, k = x.shape
    k2, n = w.shape
    if k != k2:
        raise ValueError(f"inner dims differ: {x.shape=} {w.shape=}")
    bm = m if m <= BLOCK_M else BLOCK_M   # whole dim, or a multiple of 16 rows
    bn = n if n <= BLOCK_N else BLOCK_N   # whole dim, or a multiple of 128 columns
    return _gemm_softmax(x, w, bm=bm, bn=bn)
