"""Row-wise sum and max over whole-row slabs with lane-wise loop carries.

Grid: one "parallel" axis over row blocks of whole rows (x read once, no padding). Inside a
step a lax.fori_loop walks the row in 128-lane column groups and folds each group into two
[block_rows, 128] float32 loop carries elementwise (running sum, running max): the loop body
is plain vector adds and maxes, with no cross-lane reduction. After the loop the carries are
reduced across their 128 lanes once per row, and the d % 128 columns left after the last full
group (a static tail slice) are reduced directly and merged in.

Ragged edges: no padding and no masks: the loop covers only whole 128-lane groups inside d
and the static tail covers exactly the remainder (a row narrower than 128 is all tail). A
ragged last row block computes on rows that are never written back; few rows make one
full-dim block.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 128
_BLOCK_BYTES = 4 << 20
_LANES = 128
VMEM_LIMIT_BYTES = 32 << 20


def sum_max_kernel(x_ref, sum_ref, max_ref):
    br, d = x_ref.shape
    n_full = d // _LANES
    s = jnp.zeros((br, 1), jnp.float32)
    mx = jnp.full((br, 1), -jnp.inf, jnp.float32)
    if n_full:
        def group(c, carry):
            acc_s, acc_m = carry
            c0 = pl.multiple_of(c * _LANES, _LANES)
            v = x_ref[:, pl.ds(c0, _LANES)].astype(jnp.float32)     # [br, 128]
            return acc_s + v, jnp.maximum(acc_m, v)

        init = (jnp.zeros((br, _LANES), jnp.float32),
                jnp.full((br, _LANES), -jnp.inf, jnp.float32))
        acc_s, acc_m = jax.lax.fori_loop(0, n_full, group, init)
        s = jnp.sum(acc_s, axis=1, keepdims=True)
        mx = jnp.max(acc_m, axis=1, keepdims=True)
    if d % _LANES:                                                  # static remainder
        tail = x_ref[:, n_full * _LANES:].astype(jnp.float32)
        s = s + jnp.sum(tail, axis=1, keepdims=True)
        mx = jnp.maximum(mx, jnp.max(tail, axis=1, keepdims=True))
    sum_ref[...] = s.astype(sum_ref.dtype)
    max_ref[...] = mx.astype(max_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _sum_max(x, *, br):
    rows, d = x.shape
    out_spec = pl.BlockSpec((br, 1), lambda i: (i, 0))
    sums, maxes = pl.pallas_call(
        sum_max_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=[out_spec, out_spec],
        out_shape=[jax.ShapeDtypeStruct((rows, 1), x.dtype)] * 2,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return sums.reshape(rows), maxes.reshape(rows)


def kernel(x):
    rows, d = x.shape
    itemsize = jnp.dtype(x.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)                     # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (itemsize * d)) // sublane * sublane
    cap = max(sublane, cap)
    return _sum_max(x, br=rows if rows <= cap else cap)
