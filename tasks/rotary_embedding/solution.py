"""Rotary position embedding (rotate-half convention) of q and k in one kernel.

q and k [B, S, H, D] are viewed as [B, S, H*D] (a free reshape), so a block is a lane-dense
[bs, H*D] slab of positions; grid (batch, position blocks), both "parallel", every element read
and written once. Blocks are large (up to BLOCK_ROWS positions and _BLOCK_BYTES per block, in
the input dtype: bf16 512 x 4096) because at bench sizes the fixed cost per grid step is what
small blocks lose (32 steps for 4 x 4096 positions); the four double-buffered blocks need more
than the default scoped VMEM, so the limit is VMEM_LIMIT_BYTES.

The kernel builds cos and sin from iota: position = block start + row, frequency index =
(lane mod D) mod D/2, inv_freq = base^(-2i/D). The pattern repeats every period = lcm(D, 128)
lanes, so the transcendentals are computed once per block on one period, and a loop walks the
slab one period of lanes at a time (whole heads, so the f32 temporaries stay one period wide).
rotate_half(x) = concat(-x2, x1) per head is two lane rotations of the chunk: lane j takes
x[j + D/2] (negated) in the first half of its head and x[j - D/2] in the second, and both
sources lie in the same head. H*D that is not a multiple of 128 is padded with zero lanes in
the wrapper.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BASE = 10000.0
BLOCK_ROWS = 512
_BLOCK_BYTES = 4 << 20   # one [bs, H*D] block, in the input dtype, at most
VMEM_LIMIT_BYTES = 64 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def rope_kernel(q_ref, k_ref, qo_ref, ko_ref, *, head_dim, period):
    bs, lanes = q_ref.shape
    half = head_dim // 2
    # cos/sin on one period of lanes, shared by every chunk of the slab.
    pos = (pl.program_id(1) * bs + lax.broadcasted_iota(jnp.int32, (bs, period), 0))
    lane = lax.broadcasted_iota(jnp.int32, (1, period), 1)
    freq_idx = (lane % head_dim) % half
    inv_freq = jnp.exp(freq_idx.astype(jnp.float32) * (-2.0 * math.log(BASE) / head_dim))
    angle = pos.astype(jnp.float32) * inv_freq                                  # [bs, period]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    first_half = (lax.broadcasted_iota(jnp.int32, (bs, period), 1) % head_dim) < half

    def rotate(x_ref, o_ref, start):
        x = x_ref[:, pl.ds(start, period)].astype(jnp.float32)                  # [bs, period]
        from_right = pltpu.roll(x, period - half, 1)   # lane j holds x[j + half]
        from_left = pltpu.roll(x, half, 1)             # lane j holds x[j - half]
        rotated = jnp.where(first_half, -from_right, from_left)
        o_ref[:, pl.ds(start, period)] = (x * cos + rotated * sin).astype(o_ref.dtype)

    def chunk(c, _):
        start = pl.multiple_of(c * period, 128)
        rotate(q_ref, qo_ref, start)
        rotate(k_ref, ko_ref, start)
        return 0

    lax.fori_loop(0, lanes // period, chunk, 0)


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
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(flat(q), flat(k))
    unflat = lambda x: x[:, :, :h * d].reshape(b, s, h, d)
    return unflat(q_rot), unflat(k_rot)


def kernel(q, k):
    if q.ndim != 4 or k.shape != q.shape or q.shape[-1] % 2:
        raise ValueError(f"expected q, k of one shape [B, S, H, D] with even D, "
                         f"got {q.shape=} {k.shape=}")
    b, s, h, d = q.shape
    itemsize = jnp.dtype(q.dtype).itemsize
    sublane = 8 * max(1, 4 // itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _BLOCK_BYTES // (itemsize * _round_up(h * d, 128)))
    cap = max(sublane, cap // sublane * sublane)
    return _rope(q, k, bs=s if s <= cap else cap)
