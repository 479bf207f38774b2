"""Top-8 values per row (descending) by k = 8 rounds of "take the row max, knock out its first
occurrence".

Sorting does not lower for TPU; k is small, so k max-reductions over VMEM-resident rows are
cheap. Ties behave like lax.top_k: an equal value is returned again in the next round, because
only the first position holding the max is knocked out.

Grid: one "parallel" axis over row blocks of whole rows; x is read once. The DMA block is large
(up to BLOCK_ROWS rows and _BLOCK_BYTES) because at bench sizes the fixed cost per grid step
is what small blocks lose (bf16 8192 x 4096: 16 steps). The k rounds run on SUB_ROWS-row
slices of the block in a loop, so their f32 working copies stay small whatever the block size.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

K = 8
BLOCK_ROWS = 1024
SUB_ROWS = 32                   # rows per k-round pass (a multiple of the bf16 sublane tile)
_BLOCK_BYTES = 8 << 20          # one input block, in the input dtype, at most
VMEM_LIMIT_BYTES = 32 << 20


def topk_kernel(x_ref, o_ref, *, k, sub):
    br, d = x_ref.shape
    pos = jax.lax.broadcasted_iota(jnp.int32, (sub, d), 1)

    def rows(r, _):
        r0 = pl.multiple_of(r * sub, sub)
        x = x_ref[pl.ds(r0, sub), :].astype(jnp.float32)              # [sub, d]
        best = []
        for _ in range(k):                                            # static k
            m = jnp.max(x, axis=1, keepdims=True)                     # [sub, 1]
            first = jnp.min(jnp.where(x == m, pos, d), axis=1, keepdims=True)
            best.append(m)
            x = jnp.where(pos == first, -jnp.inf, x)
        o_ref[pl.ds(r0, sub), :] = jnp.concatenate(best, axis=1).astype(o_ref.dtype)
        return 0

    jax.lax.fori_loop(0, br // sub, rows, 0)


@functools.partial(jax.jit, static_argnames=("br", "sub"))
def _topk_2d(x, *, br, sub):
    rows, d = x.shape
    return pl.pallas_call(
        functools.partial(topk_kernel, k=K, sub=sub),
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((br, K), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, K), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    shape = x.shape
    d = shape[-1]
    x2 = x.reshape(-1, d)
    rows = x2.shape[0]
    if rows <= SUB_ROWS:
        br = sub = rows                     # one block, one pass, the full (legal) row count
    else:
        cap = min(BLOCK_ROWS, _BLOCK_BYTES // (jnp.dtype(x.dtype).itemsize * d))
        cap = max(SUB_ROWS, cap // SUB_ROWS * SUB_ROWS)
        # A multiple of SUB_ROWS; a ragged last block computes on rows never written back.
        br, sub = min(cap, rows // SUB_ROWS * SUB_ROWS), SUB_ROWS
    out = _topk_2d(x2, br=br, sub=sub)
    return out.reshape(*shape[:-1], K)
