"""grouped_matmul over a grid of groups with row masks, without scalar prefetch of group data."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def gmm_kernel(starts_ref, ends_ref, lhs_ref, rhs_ref, o_ref):
    g = pl.program_id(0)

    @pl.when(g == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    rows = jax.lax.broadcasted_iota(jnp.int32, (lhs_ref.shape[0], 1), 0)
    mask = (rows >= starts_ref[g]) & (rows < ends_ref[g])
    prod = jnp.dot(lhs_ref[...], rhs_ref[0], preferred_element_type=jnp.float32)
    o_ref[...] += jnp.where(mask, prod, 0.0)


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    g, _, n = rhs.shape
    ends = jnp.cumsum(group_sizes).astype(jnp.int32)
    starts = ends - group_sizes
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    out = pl.pallas_call(
        gmm_kernel,
        grid=(g,),
        in_specs=[smem, smem, pl.BlockSpec((m, k), lambda i: (0, 0)),
                  pl.BlockSpec((1, k, n), lambda i: (i, 0, 0))],
        out_specs=pl.BlockSpec((m, n), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(starts, ends, lhs, rhs)
    return out.astype(lhs.dtype)
# task: grouped_matmul  expect: missing_feature
