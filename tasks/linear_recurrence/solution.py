"""Diagonal linear recurrence (selective scan): chunked over time, state carried in VMEM scratch.

Grid (batch, D tiles, T chunks); the chunk axis is last and "arbitrary", so for one (batch,
D tile) the chunks arrive in order and the state h [N, Dt] (float32, VMEM scratch, D on the
lanes) carries from one chunk to the next; it is zeroed at chunk 0. Within a chunk the kernel
steps through time in groups of 16 rows: it loads a [16, Dt] slab of x and a, runs the 16
updates h = a_t * h + b_t (x) x_t unrolled, and stores the [16, Dt] slab of y_t = c_t . h_t.
b and c are transposed to [B, N, T] in the wrapper so that b_t, c_t arrive as [N, 1] columns
(picked out of the chunk's [N, Tc] tile with a lane mask and a row sum), which broadcast
against h without any relayout. T and D are zero-padded to the block sizes: padded steps come
after every real one and padded channels are sliced off, so neither changes the result.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_GROUP = 16  # time steps per unrolled group: one aligned [16, Dt] slab (bf16 packs 16 rows)


def _round_up(x, m):
    return (x + m - 1) // m * m


def scan_kernel(x_ref, a_ref, bt_ref, ct_ref, y_ref, h_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        h_ref[...] = jnp.zeros_like(h_ref)

    bt = bt_ref[...].astype(jnp.float32)  # [N, Tc]
    ct = ct_ref[...].astype(jnp.float32)  # [N, Tc]
    lane = lax.broadcasted_iota(jnp.int32, bt.shape, 1)
    chunk = x_ref.shape[0]

    def group(i, h):
        base = pl.multiple_of(i * _GROUP, _GROUP)
        xs = x_ref[pl.ds(base, _GROUP), :].astype(jnp.float32)  # [G, Dt]
        as_ = a_ref[pl.ds(base, _GROUP), :].astype(jnp.float32)
        rows = []
        for j in range(_GROUP):
            hit = lane == base + j
            b_col = jnp.sum(jnp.where(hit, bt, 0.0), axis=1, keepdims=True)  # [N, 1]
            c_col = jnp.sum(jnp.where(hit, ct, 0.0), axis=1, keepdims=True)  # [N, 1]
            h = as_[j:j + 1, :] * h + b_col * xs[j:j + 1, :]                 # [N, Dt]
            rows.append(jnp.sum(c_col * h, axis=0, keepdims=True))           # [1, Dt]
        y_ref[pl.ds(base, _GROUP), :] = jnp.concatenate(rows, axis=0).astype(y_ref.dtype)
        return h

    h_ref[...] = lax.fori_loop(0, chunk // _GROUP, group, h_ref[...])


@functools.partial(jax.jit, static_argnames=("block_t", "block_d"))
def _scan(x, a, b, c, *, block_t, block_d):
    batch, seq, dim = x.shape
    n = b.shape[-1]
    t_pad, d_pad = _round_up(seq, block_t), _round_up(dim, block_d)
    pad_td = ((0, 0), (0, t_pad - seq), (0, d_pad - dim))
    x_p, a_p = jnp.pad(x, pad_td), jnp.pad(a, pad_td)
    pad_tn = ((0, 0), (0, t_pad - seq), (0, 0))
    bt = jnp.pad(b, pad_tn).transpose(0, 2, 1)  # [B, N, T]
    ct = jnp.pad(c, pad_tn).transpose(0, 2, 1)
    td_spec = pl.BlockSpec((None, block_t, block_d), lambda i, j, k: (i, k, j))
    nt_spec = pl.BlockSpec((None, n, block_t), lambda i, j, k: (i, 0, k))
    y = pl.pallas_call(
        scan_kernel,
        grid=(batch, d_pad // block_d, t_pad // block_t),
        in_specs=[td_spec, td_spec, nt_spec, nt_spec],
        out_specs=td_spec,
        out_shape=jax.ShapeDtypeStruct((batch, t_pad, d_pad), x.dtype),
        scratch_shapes=[pltpu.VMEM((n, block_d), jnp.float32)],  # h, carried across chunks
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x_p, a_p, bt, ct)
    return y[:, :seq, :dim]


def kernel(x, a, b, c):
    batch, seq, dim = x.shape
    if a.shape != x.shape or b.shape[:2] != (batch, seq) or c.shape != b.shape:
        raise ValueError(f"shape mismatch: {x.shape=} {a.shape=} {b.shape=} {c.shape=}")
    # Chunks of 128 steps (the smallest lane-aligned [N, Tc] tile) for short sequences, 512 for
    # long ones; 256 channels per tile when D allows, else 128.
    block_t = 512 if seq >= 2048 else 128
    d_pad = _round_up(dim, 128)
    block_d = 256 if d_pad % 256 == 0 else 128
    return _scan(x, a, b, c, block_t=block_t, block_d=block_d)
