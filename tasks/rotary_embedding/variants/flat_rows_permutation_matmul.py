"""RoPE over flattened head vectors, with rotate-half as a signed-permutation matmul.

q and k [B, S, H, D] are viewed as [B*S*H, D] (a free reshape): one row per (batch, position,
head) vector. Grid (row blocks,), 1-D and "parallel"; a block is [br, D] (D whole). Each row's
position is recovered in the kernel from its flat row index, pos = (row // H) % S, so cos/sin
are built per row from iota (no table in HBM, nothing shared between heads).

rotate_half(x) = concat(-x2, x1) is linear in x, so the kernel applies it as x @ P on the MXU:
P [D, D] is built from iota with P[j + D/2, j] = -1 and P[j - D/2, j] = +1 (every column has
exactly one +-1), and the dot runs at HIGHEST precision for f32 (one pass is exact for bf16), so the
rotation is exact.
out = x * cos + (x @ P) * sin.

Ragged edges: the row axis uses a cdiv grid; the last block's extra rows read padding and are
never written back. D is a whole-dim block, so no lane padding or masking.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BASE = 10000.0
BLOCK_ROWS = 1024
VMEM_LIMIT_BYTES = 32 << 20


def rope_rows_kernel(q_ref, k_ref, qo_ref, ko_ref, *, heads, seq, head_dim):
    br, d = q_ref.shape
    half = head_dim // 2
    row = pl.program_id(0) * br + lax.broadcasted_iota(jnp.int32, (br, 1), 0)
    pos = lax.rem(lax.div(row, jnp.int32(heads)), jnp.int32(seq))              # [br, 1]
    lane = lax.broadcasted_iota(jnp.int32, (1, d), 1)
    freq_idx = lax.rem(lane, jnp.int32(half)).astype(jnp.float32)
    inv_freq = jnp.exp(freq_idx * (-2.0 * math.log(BASE) / head_dim))         # [1, D]
    angle = pos.astype(jnp.float32) * inv_freq                                 # [br, D]
    cos, sin = jnp.cos(angle), jnp.sin(angle)

    i = lax.broadcasted_iota(jnp.int32, (d, d), 0)
    j = lax.broadcasted_iota(jnp.int32, (d, d), 1)
    perm = jnp.where(i == j + half, -1.0, jnp.where(i + half == j, 1.0, 0.0))  # [D, D]

    for x_ref, o_ref in ((q_ref, qo_ref), (k_ref, ko_ref)):
        x = x_ref[...]
        # f32 needs HIGHEST to stay exact; a bf16 x times +-1 is exact in one MXU pass.
        precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
        rotated = jnp.dot(x, perm.astype(x.dtype), precision=precision,
                          preferred_element_type=jnp.float32)
        o_ref[...] = (x.astype(jnp.float32) * cos + rotated * sin).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("br",))
def _rope(q, k, *, br):
    b, s, h, d = q.shape
    rows = b * s * h
    spec = pl.BlockSpec((br, d), lambda r: (r, 0))
    shape = jax.ShapeDtypeStruct((rows, d), q.dtype)
    q_rot, k_rot = pl.pallas_call(
        functools.partial(rope_rows_kernel, heads=h, seq=s, head_dim=d),
        grid=(pl.cdiv(rows, br),),
        in_specs=[spec, spec],
        out_specs=[spec, spec],
        out_shape=[shape, shape],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(q.reshape(rows, d), k.reshape(rows, d))
    return q_rot.reshape(q.shape), k_rot.reshape(k.shape)


def kernel(q, k):
    if q.ndim != 4 or k.shape != q.shape or q.shape[-1] % 2:
        raise ValueError(f"expected q, k of one shape [B, S, H, D] with even D, "
                         f"got {q.shape=} {k.shape=}")
    b, s, h, d = q.shape
    rows = b * s * h
    # Rows per block: ~BLOCK_ROWS * 128 lanes of data, a multiple of 16 rows.
    cap = max(16, BLOCK_ROWS * 128 // max(d, 128) // 16 * 16)
    return _rope(q, k, br=rows if rows <= cap else cap)
