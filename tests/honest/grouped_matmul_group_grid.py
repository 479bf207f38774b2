"""grouped_matmul, another style: a grid over (row tiles, n tiles, groups) with the group
offsets scalar-prefetched to SMEM; each group's rows are masked in, groups that miss the row
tile are skipped, and the output tile accumulates in place across groups."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN = 256, 256


def group_kernel(starts_ref, ends_ref, lhs_ref, rhs_ref, o_ref, acc_ref):
    i, g = pl.program_id(0), pl.program_id(2)

    @pl.when(g == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    lo, hi = starts_ref[g], ends_ref[g]
    row0 = i * BM

    @pl.when((lo < row0 + BM) & (hi > row0))
    def _():
        rows = row0 + jax.lax.broadcasted_iota(jnp.int32, (BM, 1), 0)
        prod = jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] += jnp.where((rows >= lo) & (rows < hi), prod, 0.0)

    @pl.when(g == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    g, _, n = rhs.shape
    lhs_p = jnp.pad(lhs, ((0, -m % BM), (0, -k % 128)))
    rhs_p = jnp.pad(rhs, ((0, 0), (0, -k % 128), (0, -n % BN)))
    kp = lhs_p.shape[1]
    ends = jnp.cumsum(group_sizes).astype(jnp.int32)
    starts = (ends - group_sizes).astype(jnp.int32)
    out = pl.pallas_call(
        group_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(lhs_p.shape[0] // BM, rhs_p.shape[2] // BN, g),
            in_specs=[pl.BlockSpec((BM, kp), lambda i, j, gg, s, e: (i, 0)),
                      pl.BlockSpec((None, kp, BN), lambda i, j, gg, s, e: (gg, 0, j))],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j, gg, s, e: (i, j)),
            scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((lhs_p.shape[0], rhs_p.shape[2]), lhs.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(starts, ends, lhs_p, rhs_p)
    return out[:m, :n]
