"""Rotary position embedding (rotate-half convention) of q and k in one kernel.

q and k [B, S, H, D] are viewed as [B, S, H*D] (a free reshape), so a block is a lane-dense
[bs, H*D] slab of positions. The kernel builds cos and sin from iota: position = block start +
row, frequency index = (lane mod D) mod D/2, inv_freq = base^(-2i/D). The pattern repeats every
lcm(D, 128) lanes, so the transcendentals are computed on one such period and tiled across the
heads. rotate_half(x) = concat(-x2, x1) per head is two lane rotations of the whole slab:
lane j takes x[j + D/2] (negated) in the first half of its head and x[j - D/2] in the second,
and both sources lie in the same head. H*D that is not a multiple of 128 is padded with zero
lanes in the wrapper.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BASE = 10000.0
_BLOCK_BYTES = 1 << 20   # one [bs, H*D] block in float32
_MAX_BLOCK_ROWS = 256


def _round_up(x, m):
    return (x + m - 1) // m * m


def rope_kernel(q_ref, k_ref, qo_ref, ko_ref, *, head_dim, period):
    bs, lanes = q_ref.shape
    half = head_dim // 2
    # cos/sin on one period of lanes, then tiled across the slab.
    pos = (pl.program_id(1) * bs + lax.broadcasted_iota(jnp.int32, (bs, period), 0))
    lane = lax.broadcasted_iota(jnp.int32, (bs, period), 1)
    freq_idx = (lane % head_dim) % half
    inv_freq = jnp.exp(freq_idx.astype(jnp.float32) * (-2.0 * math.log(BASE) / head_dim))
    angle = pos.astype(jnp.float32) * inv_freq
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if lanes != period:
        cos = jnp.tile(cos, (1, lanes // period))
        sin = jnp.tile(sin, (1, lanes // period))
    first_half = (lax.broadcasted_iota(jnp.int32, (bs, lanes), 1) % head_dim) < half

    def rotate(x_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        from_right = pltpu.roll(x, lanes - half, 1)   # lane j holds x[j + half]
        from_left = pltpu.roll(x, half, 1)            # lane j holds x[j - half]
        rotated = jnp.where(first_half, -from_right, from_left)
        o_ref[...] = (x * cos + rotated * sin).astype(o_ref.dtype)

    rotate(q_ref, qo_ref)
    rotate(k_ref, ko_ref)


@functools.partial(jax.jit, static_argnames=("bs",))
def _rope(q, k, *, bs):
    b, s, h, d = q.shape
    lanes = _round_up(h * d, 128)
    period = math.lcm(d, 128)
    if lanes % period:
        period = lanes

    def flat(x):
        x = x.reshape(b, s, h * d)
        return jnp.pad(x, ((0, 0), (0, 0), (0, lanes - h * d))) if lanes != h * d else x

    spec = pl.BlockSpec((pl.squeezed, bs, lanes), lambda i, j: (i, j, 0))
    shape = jax.ShapeDtypeStruct((b, s, lanes), q.dtype)
    q_rot, k_rot = pl.pallas_call(
        functools.partial(rope_kernel, head_dim=d, period=period),
        grid=(b, pl.cdiv(s, bs)),   # a ragged last block: its extra rows are never written
        in_specs=[spec, spec],
        out_specs=[spec, spec],
        out_shape=[shape, shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(flat(q), flat(k))
    unflat = lambda x: x[:, :, :h * d].reshape(b, s, h, d)
    return unflat(q_rot), unflat(k_rot)


def kernel(q, k):
    if q.ndim != 4 or k.shape != q.shape or q.shape[-1] % 2:
        raise ValueError(f"expected q, k of one shape [B, S, H, D] with even D, "
                         f"got {q.shape=} {k.shape=}")
    b, s, h, d = q.shape
    sublane = 8 * max(1, 4 // jnp.dtype(q.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(_MAX_BLOCK_ROWS, _BLOCK_BYTES // (4 * _round_up(h * d, 128)))
    cap = max(sublane, cap // sublane * sublane)
    return _rope(q, k, bs=s if s <= cap else cap)
