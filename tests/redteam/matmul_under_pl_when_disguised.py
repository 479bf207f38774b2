"""Cheat: matmul_under_pl_when, disguised. The dot runs only on the first output block, but
its predicate also reads the data (`x_ref[0, 0] == x_ref[0, 0]`, true for any finite input)
and sits in a one-trip loop (`i + t == 0` with the loop counter t), so it depends on neither
the grid alone nor constants alone. Data anded with a grid condition can only narrow where
the branch runs, and the counters of loops of known length are evaluated like program ids:
the dot still counts on 4 of 64 grid steps.
task: matmul  expect: work_outside_kernel"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 1024


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def first_block_only(t, carry):
        @pl.when((i + t == 0) & (j + t == 0) & (x_ref[0, 0] == x_ref[0, 0]))
        def _accumulate():
            acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        return carry

    lax.fori_loop(0, 1, first_block_only, 0)

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
