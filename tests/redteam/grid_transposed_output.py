"""Cheat (or bug) hidden by small check sizes: softmax(x) @ v whose output index map swaps
the grid indices, `(j, i)` for `(i, j)`. Every check case fits in one (M, N) block, so the
map returns (0, 0) and the run is right; at the bench size (4096 x 2048 output, 8 x 2 blocks)
it writes row blocks to column positions past the array's end. Only evaluating the index
map over the whole bench grid sees it (evaluator/analysis/grid_checks.py).
task: softmax_matmul  expect: runtime_error"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG = -1e30


def _round_up(x, m):
    return (x + m - 1) // m * m


def attend_kernel(x_ref, v_ref, o_ref, mx_ref, sum_ref, acc_ref, *, k_true, bk):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _start():
        mx_ref[...] = jnp.full_like(mx_ref, -jnp.inf)
        sum_ref[...] = jnp.zeros_like(sum_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    s = x_ref[...].astype(jnp.float32)                              # [bm, bk]
    col = kk * bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(col < k_true, s, NEG)
    new_max = jnp.maximum(mx_ref[...], s.max(axis=-1, keepdims=True))
    scale = jnp.exp(mx_ref[...] - new_max)
    p = jnp.exp(s - new_max)
    sum_ref[...] = scale * sum_ref[...] + p.sum(axis=-1, keepdims=True)
    acc_ref[...] = scale * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                  preferred_element_type=jnp.float32)
    mx_ref[...] = new_max

    @pl.when(kk == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / sum_ref[...]).astype(o_ref.dtype)


def kernel(x, v):
    m, k = x.shape
    n = v.shape[1]
    rows = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm, bn, bk = min(512, _round_up(m, rows)), min(1024, _round_up(n, 128)), 512
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    vp = jnp.pad(v, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        functools.partial(attend_kernel, k_true=k, bk=bk),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (j, i)),  # transposed
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32), pltpu.VMEM((bm, 1), jnp.float32),
                        pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=64 * 1024 * 1024),
    )(xp, vp)
    return out[:m, :n]
