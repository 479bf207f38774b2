"""Mamba2 SSD scan by chunks: an intra-chunk quadratic form on the MXU, the state carried
across chunks in a float32 VMEM scratch.

Grid (batch, chunk, head block); the chunk and head-block axes are "arbitrary" (sequential):
for one batch row the chunks arrive in order, and within a chunk the head blocks. The scratch
`state` holds every head's state S[n, p] (float32) for the batch row and carries it from one
chunk to the next; a head block zeroes its heads' states at chunk 0.

Per chunk of T steps the first head block (head block 0) computes, for every group, C B^T
[T, T] (bf16 operands, f32 accumulation), B^T [n, T] and C [T, n] into scratches that the
chunk's other head blocks reuse: B and C are shared by the heads of a group, and their blocks
(all groups side by side in lanes) are fetched once per chunk. Each head block then takes its
hb heads' dt [hb, T] and forms the chunk's cumulative log-decays cum[t] = sum_{s <= t} dt_s A
(an f32 matmul with a triangle of ones, HIGHEST precision) as columns [T, hb] and, exactly
transposed by a matmul with the identity, as rows [hb, T]. For each head (unrolled over the
block):

    L[t, s]  = exp(cum[t] - cum[s]) for s <= t, else 0     (masked before the exp: no overflow)
    y        = (C B^T * L * dt[s]) @ x                      intra-chunk, on the MXU
             + exp(cum[t]) * (C @ S)                        the state that entered the chunk
             + D x
    S       <- exp(cum[T-1]) * S + (B^T * exp(cum[T-1] - cum[s]) dt[s]) @ x

Every exponent is a difference cum[t] - cum[s] <= 0 or cum[t] <= 0, so nothing overflows when a
chunk's decay underflows (exp(-cum) is never formed). x and y travel as [T, hb * p] lane blocks
of the [b, l, h * p] view of x, B and C as [T, g * n] blocks of their [b, l, g * n] views (free
reshapes); dt goes to [b, heads / hb, hb, l] in the wrapper (a small transpose: one value per
head and step); A and D sit in SMEM. Matmul operands are bf16 (what the MXU takes from f32 at
default precision), sums f32.

Nothing is padded in HBM: the last chunk may overhang the sequence; its rows past the end are
zeroed (x, dt, B) before use, so whatever the buffer held there (stale or NaN) reaches no real
output, and their outputs are dropped on write-back.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 256            # tune: 128, 256, 512  (time steps per chunk; a multiple of 128)
HEADS_PER_BLOCK = 16   # tune: 8, 16, 32  (heads per grid step, at most)
_MiB = 1 << 20
_HIGHEST = lax.Precision.HIGHEST
_NT = (((1,), (1,)), ((), ()))  # contract the last dims of both operands: a @ b.T


def _round_up(x, m):
    return (x + m - 1) // m * m


def ssd_kernel(x_ref, dt_ref, a_ref, d_ref, b_ref, c_ref, y_ref, state_ref, cb_ref, bt_ref, cg_ref, *,
               seq, per_group, headdim):
    ci, hi = pl.program_id(1), pl.program_id(2)
    chunk = x_ref.shape[0]
    groups, n = cb_ref.shape[0], bt_ref.shape[1]
    hb = dt_ref.shape[0]
    h0 = hi * hb
    valid = seq - ci * chunk  # real steps in this chunk (more than chunk before the last one)

    @pl.when(ci == 0)
    def _init():
        state_ref[pl.ds(h0, hb)] = jnp.zeros((hb, n, headdim), jnp.float32)

    @pl.when(hi == 0)
    def _shared():
        rows = lax.broadcasted_iota(jnp.int32, (chunk, 1), 0) < valid
        for gi in range(groups):  # group gi: lanes gi * n .. (gi + 1) * n of the B and C blocks
            b = jnp.where(rows, b_ref[:, gi * n:(gi + 1) * n].astype(jnp.float32), 0.0)  # [T, n]
            c = c_ref[:, gi * n:(gi + 1) * n].astype(jnp.bfloat16)
            cb_ref[gi] = lax.dot_general(c, b.astype(jnp.bfloat16), _NT,
                                         preferred_element_type=jnp.float32)  # [T, T]
            bt_ref[gi] = b.T                                              # [n, T]
            cg_ref[gi] = c

    lanes = lax.broadcasted_iota(jnp.int32, (1, chunk), 1)
    dt = jnp.where(lanes < valid, dt_ref[...], 0.0)                      # [hb, T]
    head_rows = lax.broadcasted_iota(jnp.int32, (hb, 1), 0)
    a_col = jnp.zeros((hb, 1), jnp.float32)
    for j in range(hb):
        a_col = jnp.where(head_rows == j, a_ref[h0 + j], a_col)
    t_row = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    t_col = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    causal = t_row >= t_col
    cum_col = lax.dot_general(causal.astype(jnp.float32), dt * a_col, _NT,
                              precision=_HIGHEST, preferred_element_type=jnp.float32)  # [T, hb]
    eye = (lax.broadcasted_iota(jnp.int32, (hb, hb), 0)
           == lax.broadcasted_iota(jnp.int32, (hb, hb), 1)).astype(jnp.float32)
    cum_row = lax.dot_general(eye, cum_col, _NT, precision=_HIGHEST,
                              preferred_element_type=jnp.float32)                     # [hb, T]

    x_rows = lax.broadcasted_iota(jnp.int32, (chunk, 1), 0) < valid
    x = jnp.where(x_rows, x_ref[...].astype(jnp.float32), 0.0)          # [T, hb * p]
    outs = []
    for j in range(hb):
        head = h0 + j
        grp = head // per_group
        cc, cr, dt_j = cum_col[:, j:j + 1], cum_row[j:j + 1, :], dt[j:j + 1, :]
        decay = jnp.exp(jnp.where(causal, cc - cr, -jnp.inf))            # [T, T]
        m = cb_ref[grp] * (decay * dt_j)
        xj = x[:, j * headdim:(j + 1) * headdim]                        # [T, p]
        xj16 = xj.astype(jnp.bfloat16)
        state = state_ref[head]                                          # [n, p]
        y = jnp.dot(m.astype(jnp.bfloat16), xj16, preferred_element_type=jnp.float32)
        y_prev = jnp.dot(cg_ref[grp], state.astype(jnp.bfloat16),
                         preferred_element_type=jnp.float32)
        outs.append(y + jnp.exp(cc) * y_prev + d_ref[head] * xj)
        last = cr[:, chunk - 1:]                                         # [1, 1]
        weight = jnp.exp(last - cr) * dt_j                               # [1, T]
        state_ref[head] = jnp.exp(last) * state + jnp.dot(
            (bt_ref[grp] * weight).astype(jnp.bfloat16), xj16, preferred_element_type=jnp.float32)
    y_ref[...] = jnp.concatenate(outs, axis=1).astype(y_ref.dtype)


@functools.partial(jax.jit, static_argnames=("chunk", "hb"))
def _ssd(x, dt, A, B, C, D, *, chunk, hb):
    batch, seq, heads, headdim = x.shape
    groups, n = B.shape[2], B.shape[3]
    x2 = x.reshape(batch, seq, heads * headdim)
    dt4 = dt.transpose(0, 2, 1).reshape(batch, heads // hb, hb, seq)
    b2, c2 = B.reshape(batch, seq, groups * n), C.reshape(batch, seq, groups * n)
    x_spec = pl.BlockSpec((None, chunk, hb * headdim), lambda b, c, h: (b, c, h))
    dt_spec = pl.BlockSpec((None, None, hb, chunk), lambda b, c, h: (b, h, 0, c))
    bc_spec = pl.BlockSpec((None, chunk, groups * n), lambda b, c, h: (b, c, 0))
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    item = x.dtype.itemsize
    vmem = (4 * chunk * hb * headdim * (item + 4) + 4 * chunk * _round_up(groups * n, 128) * B.dtype.itemsize
            + heads * n * _round_up(headdim, 128) * 4 + groups * chunk * (chunk + n) * 4
            + groups * chunk * _round_up(n, 128) * 2 + 12 * chunk * chunk * 4 + 8 * _MiB)
    y2 = pl.pallas_call(
        functools.partial(ssd_kernel, seq=seq, per_group=heads // groups, headdim=headdim),
        grid=(batch, pl.cdiv(seq, chunk), heads // hb),
        in_specs=[x_spec, dt_spec, smem, smem, bc_spec, bc_spec],
        out_specs=x_spec,
        out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((heads, n, headdim), jnp.float32),   # S per head, across chunks
                        pltpu.VMEM((groups, chunk, chunk), jnp.float32),  # C B^T per group
                        pltpu.VMEM((groups, n, chunk), jnp.float32),      # B^T per group
                        pltpu.VMEM((groups, chunk, n), jnp.bfloat16)],    # C per group
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(x2, dt4, A.astype(jnp.float32), D.astype(jnp.float32), b2, c2)
    return y2.reshape(x.shape)


def _heads_per_block(heads, headdim):
    """The most heads, up to HEADS_PER_BLOCK, that divide the heads and fill whole 128-lane
    tiles (2 heads of 64); all heads where no such block exists (an odd count of 64)."""
    unit = 128 // math.gcd(headdim, 128)
    if heads % unit:
        return heads
    fits = [m for m in range(unit, heads + 1, unit) if heads % m == 0 and m <= max(HEADS_PER_BLOCK, unit)]
    return max(fits)


def kernel(x, dt, A, B, C, D):
    batch, seq, heads, headdim = x.shape
    if (dt.shape != (batch, seq, heads) or A.shape != (heads,) or D.shape != (heads,)
            or B.shape[:2] != (batch, seq) or C.shape != B.shape or heads % B.shape[2]):
        raise ValueError(f"shape mismatch: {x.shape=} {dt.shape=} {A.shape=} {B.shape=} {C.shape=} {D.shape=}")
    chunk = min(CHUNK, _round_up(seq, 128))
    return _ssd(x, dt.astype(jnp.float32), A, B, C, D, chunk=chunk,
                hb=_heads_per_block(heads, headdim))
