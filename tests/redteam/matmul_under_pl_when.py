"""Cheat: a tiled matmul whose dot runs only on the first output block, under
`pl.when((i == 0) & (j == 0))`. At the check sizes the grid is one block, so the output is
right; at the bench size (4096^3, 1024-wide blocks) the other 15 of 16 output blocks stay
zero. A cost model that charges a pl.when's branch on every grid step credits it the whole
task's FLOPs; evaluated over the grid, the dot runs on 4 of 64 steps.
task: matmul  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 1024


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when((i == 0) & (j == 0))
    def _accumulate():
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    bm, bk, bn = min(BLOCK, m), min(BLOCK, k), min(BLOCK, n)
    pad = lambda a, r, c: jnp.pad(a, ((0, -a.shape[0] % r), (0, -a.shape[1] % c)))  # noqa: E731
    xp, yp = pad(x, bm, bk), pad(y, bk, bn)
    grid = (xp.shape[0] // bm, yp.shape[1] // bn, xp.shape[1] // bk)
    out = pl.pallas_call(
        matmul_kernel,
        grid=grid,
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((xp.shape[0], yp.shape[1]), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(xp, yp)
    return out[:m, :n]
