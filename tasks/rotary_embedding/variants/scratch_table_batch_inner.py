"""RoPE with the cos/sin block cached in VMEM scratch and reused across the batch.

Grid (position blocks "parallel", batch "arbitrary"): the batch is the inner axis, so for one
block of positions the kernel builds cos and sin [bs, 1, D] (float32, from iota: position =
block start + row, inv_freq = base^(-2 (lane mod D/2) / D)) only at batch 0, keeps them in VMEM
scratch and reuses them for every other batch element of those positions. (The batch axis must
stay on one core for that, hence "arbitrary"; the position axis can be split across cores.)

q and k keep their [B, S, H, D] layout; a block is [bs, H, D] (H and D whole dims).
rotate_half is formed explicitly per head by concatenating the negated upper half with the
lower half along the lane axis, then out = x * cos + rotate_half(x) * sin with cos/sin
broadcast over the heads.

Ragged edges: the position axis uses a cdiv grid; the last block's extra rows compute on
padding and are never written back. No padding in the wrapper.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BASE = 10000.0
BLOCK_S = 256
_BLOCK_BYTES = 2 << 20  # one [bs, H, D] block in VMEM's (8, 128)-tiled f32 layout, at most
VMEM_LIMIT_BYTES = 48 << 20


def rope_kernel(q_ref, k_ref, qo_ref, ko_ref, cos_ref, sin_ref):
    bs, _, d = q_ref.shape
    half = d // 2

    @pl.when(pl.program_id(1) == 0)
    def _table():
        pos = pl.program_id(0) * bs + lax.broadcasted_iota(jnp.int32, (bs, 1, d), 0)
        lane = lax.broadcasted_iota(jnp.int32, (bs, 1, d), 2)
        freq_idx = jnp.where(lane < half, lane, lane - half).astype(jnp.float32)
        angle = pos.astype(jnp.float32) * jnp.exp(freq_idx * (-2.0 * math.log(BASE) / d))
        cos_ref[...] = jnp.cos(angle)
        sin_ref[...] = jnp.sin(angle)

    cos, sin = cos_ref[...], sin_ref[...]
    for x_ref, o_ref in ((q_ref, qo_ref), (k_ref, ko_ref)):
        x = x_ref[...].astype(jnp.float32)                                # [bs, H, D]
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        o_ref[...] = (x * cos + rotated * sin).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bs",))
def _rope(q, k, *, bs):
    b, s, h, d = q.shape
    spec = pl.BlockSpec((pl.squeezed, bs, h, d), lambda si, bi: (bi, si, 0, 0))
    shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return pl.pallas_call(
        rope_kernel,
        grid=(pl.cdiv(s, bs), b),
        in_specs=[spec, spec],
        out_specs=[spec, spec],
        out_shape=[shape, shape],
        scratch_shapes=[pltpu.VMEM((bs, 1, d), jnp.float32),    # cos of this position block
                        pltpu.VMEM((bs, 1, d), jnp.float32)],   # sin
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(q, k)


def _round_up(x, m):
    return (x + m - 1) // m * m


def kernel(q, k):
    if q.ndim != 4 or k.shape != q.shape or q.shape[-1] % 2:
        raise ValueError(f"expected q, k of one shape [B, S, H, D] with even D, "
                         f"got {q.shape=} {k.shape=}")
    b, s, h, d = q.shape
    row_bytes = _round_up(h, 8) * _round_up(d, 128) * 4
    cap = min(BLOCK_S, max(8, _BLOCK_BYTES // row_bytes // 8 * 8))
    return _rope(q, k, bs=s if s <= cap else cap)
