"""Group norm over NHWC activations: one read of x, one write of the output.

Grid (sample, phase, spatial block): the sample axis is "parallel", the other two run in order.
Phase 0 walks the [bh, C] spatial blocks of one sample and accumulates per-channel sums of
x - pivot and (x - pivot)^2 (f32) in VMEM scratch, the pivot being the sample's first row: a
channel centred far from zero keeps its digits (E[x^2] - E[x]^2 cancels them); rows past the
end of a ragged last block are masked out. Phase 1 starts by folding those sums into
per-group mean and variance (small matmuls with a 0/1 same-group matrix built from iota),
turns them with gamma and beta into a per-channel scale and shift, then walks the blocks again
writing x * scale + shift.

BLOCK_ROWS (4096) covers a whole bench sample ([4096, 512]: 4 MiB in bf16, 8 MiB in f32), so
a sample is one block: there is then no phase axis at all, the single grid step per sample
does both sweeps on the resident block, and x is read from HBM exactly once. Samples taller
than BLOCK_ROWS fall back to the two sweeps (x read twice). The output index map is
(sample, phase * block): during phase 0 it stays on block 0, which is only written (and then
written back) in phase 1, so no unwritten block ever reaches HBM. The VMEM limit is raised
to fit the double-buffered in/out blocks plus the f32 temporaries.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
BLOCK_ROWS = 4096  # spatial rows per block (a whole sample at bench sizes)
_MIB = 1 << 20


def group_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref, s1_ref, s2_ref, pivot_ref, scale_ref, shift_ref,
                      *, hw, groups, one_pass):
    # one_pass: the whole sample is one block and the grid has no phase axis; this step does
    # both sweeps.
    phase = 0 if one_pass else pl.program_id(1)
    j = 0 if one_pass else pl.program_id(2)
    bh, c = x_ref.shape
    cg = c // groups

    def when(cond):
        return (lambda f: f()) if one_pass else pl.when(cond)

    @when((phase == 0) & (j == 0))
    def _zero():
        s1_ref[...] = jnp.zeros_like(s1_ref)
        s2_ref[...] = jnp.zeros_like(s2_ref)
        pivot_ref[...] = x_ref[0:1, :].astype(jnp.float32)             # [1, c]: row 0 of the sample

    @when(phase == 0)
    def _accumulate():
        # Sums of x - pivot, not of x: a channel centred far from zero (activations after
        # residual adds) keeps its digits; E[x^2] - E[x]^2 would cancel them.
        x = x_ref[...].astype(jnp.float32) - pivot_ref[...]            # [bh, c]
        if hw % bh:  # ragged last block: its rows past hw hold padding
            row = j * bh + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
            x = jnp.where(row < hw, x, 0.0)
        s1_ref[...] += jnp.sum(x, axis=0, keepdims=True)                # [1, c]
        s2_ref[...] += jnp.sum(x * x, axis=0, keepdims=True)

    @when((phase == 1) & (j == 0) if not one_pass else True)
    def _group_stats():
        # Per channel: its mean (pivot + mean of x - pivot) and its second central moment.
        # Per group, averaged over its channels in an MXU product with member[c, c] (1 where
        # channels i and j share a group: group = floor(channel / cg), in f32, exact for these
        # small integers): the mean, and the variance as the mean of each channel's moment
        # plus its squared distance from the group mean. HIGHEST keeps the f32 values exact.
        ci = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0).astype(jnp.float32)
        cj = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1).astype(jnp.float32)
        group_of = lambda ch: jnp.floor((ch + 0.5) * (1.0 / cg))
        member = (group_of(ci) == group_of(cj)).astype(jnp.float32)
        row = jax.lax.broadcasted_iota(jnp.int32, (8, c), 0)

        def group_mean(per_channel):                                    # [1, c] -> [1, c]
            rows = jnp.where(row == 0, per_channel, 0.0)                # [8, c]
            return jnp.dot(rows, member, precision=jax.lax.Precision.HIGHEST,
                           preferred_element_type=jnp.float32)[0:1, :] * (1.0 / cg)

        shifted_mean = s1_ref[...] * (1.0 / hw)
        channel_mean = pivot_ref[...] + shifted_mean                    # [1, c]
        moment = jnp.maximum(s2_ref[...] * (1.0 / hw) - shifted_mean * shifted_mean, 0.0)
        mean = group_mean(channel_mean)
        var = group_mean(moment + (channel_mean - mean) ** 2)
        scale = jax.lax.rsqrt(var + EPS) * gamma_ref[...].astype(jnp.float32)
        scale_ref[...] = scale
        shift_ref[...] = beta_ref[...].astype(jnp.float32) - mean * scale

    @when(phase == 1)
    def _normalise():
        x = x_ref[...].astype(jnp.float32)
        o_ref[...] = (x * scale_ref[...] + shift_ref[...]).astype(o_ref.dtype)


def _rows_per_block(hw, dtype):
    """BLOCK_ROWS (a multiple of the dtype's sublane tiling), or all of hw if that is fewer."""
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = max(sublane, BLOCK_ROWS // sublane * sublane)
    return hw if hw <= cap else cap


@functools.partial(jax.jit, static_argnames=("groups", "bh"))
def _group_norm(x, gamma, beta, *, groups, bh):
    n, hw, c = x.shape
    one_pass = bh == hw
    if one_pass:
        grid = (n,)
        x_spec = pl.BlockSpec((pl.Squeezed(), bh, c), lambda b: (b, 0, 0))
        out_spec = x_spec
        vec_spec = pl.BlockSpec((1, c), lambda b: (0, 0))
        semantics = ("parallel",)
    else:
        grid = (n, 2, pl.cdiv(hw, bh))
        x_spec = pl.BlockSpec((pl.Squeezed(), bh, c), lambda b, p, j: (b, j, 0))
        out_spec = pl.BlockSpec((pl.Squeezed(), bh, c), lambda b, p, j: (b, j * p, 0))
        vec_spec = pl.BlockSpec((1, c), lambda b, p, j: (0, 0))
        semantics = ("parallel", "arbitrary", "arbitrary")
    # Double-buffered input and output blocks plus a few f32 block-sized temporaries.
    block_bytes = bh * c * x.dtype.itemsize
    vmem = 4 * block_bytes + 3 * bh * c * 4 + 4 * _MIB
    body = functools.partial(group_norm_kernel, hw=hw, groups=groups, one_pass=one_pass)
    return pl.pallas_call(
        body,
        grid=grid,
        in_specs=[x_spec, vec_spec, vec_spec],
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((1, c), jnp.float32) for _ in range(5)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics,
            vmem_limit_bytes=int(min(max(vmem, 32 * _MIB), 100 * _MIB))),
    )(x, gamma.reshape(1, c), beta.reshape(1, c))


def kernel(x, gamma, beta):
    n, hw, c = x.shape
    groups, cg = gamma.shape
    if groups * cg != c or beta.shape != gamma.shape:
        raise ValueError(f"expected gamma, beta of shape [G, C // G]: {x.shape=} {gamma.shape=} "
                         f"{beta.shape=}")
    return _group_norm(x, gamma, beta, groups=groups, bh=_rows_per_block(hw, x.dtype))
