"""RG-LRU (Griffin / RecurrentGemma): time blocks on a sequential grid axis, state in VMEM.

Grid (batch, channel blocks, time blocks); the time axis is last and "arbitrary", so for one
(batch row, channel block) the blocks arrive in order and the state h [1, block_d] (float32,
VMEM scratch) carries from one to the next; it is zeroed at time block 0.

Within a block the kernel walks 256- or 512-lane slices of the channels (sub_d) and, per slice,
groups of 16 time steps: it loads the [16, sub_d] slabs of x, r and i, computes the gates for
the whole slab at once (log_a = -8 r softplus(lam), a = exp(log_a), the input scale
sqrt(1 - a^2) as sqrt((1 + a^2) tanh(-log_a)), exact and free of the cancellation of 1 - a * a
as a -> 1), then runs the 16 updates h = a_t h + u_t unrolled and stores the [16, sub_d] slab of
outputs. h rides in the loop carry through a slice's groups and goes back to the scratch at the
end of the block. softplus(lam) is computed once per slice and block.

Blocks: BLOCK_T time steps (512) by a channel block of at most BLOCK_D lanes that divides the
channels rounded up to 128 (2560 -> 1280, 4096 -> 2048), so no block reads lanes past the
array's 128-lane tile. Nothing is padded in HBM: a last time block or a channel block that
overhangs the arrays computes on stale values, which reach only later time steps or other
lanes, never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

C = 8.0
_GROUP = 16     # time steps per unrolled group: one aligned slab (bf16 packs 16 rows)
BLOCK_T = 512   # tune: 128, 256, 512, 1024  (time steps per block; a multiple of 16)
BLOCK_D = 2048  # tune: 512, 1024, 2048, 4096  (channels per block, at most; a multiple of 128)
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def rg_lru_kernel(x_ref, r_ref, i_ref, lam_ref, o_ref, h_ref, *, sub_d):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        h_ref[...] = jnp.zeros_like(h_ref)

    block_t, block_d = x_ref.shape

    def d_slice(s, _):
        cols = pl.ds(pl.multiple_of(s * sub_d, sub_d), sub_d)
        lam = lam_ref[:, cols].astype(jnp.float32)                      # [1, Ds]
        softplus = jnp.maximum(lam, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(lam)))
        coef = -C * softplus

        def group(g, h):
            rows = pl.ds(pl.multiple_of(g * _GROUP, _GROUP), _GROUP)
            x = x_ref[rows, cols].astype(jnp.float32)                   # [G, Ds]
            r = r_ref[rows, cols].astype(jnp.float32)
            gate_i = i_ref[rows, cols].astype(jnp.float32)
            log_a = coef * r
            a = jnp.exp(log_a)
            # 1 - a^2 = (1 + a^2) * tanh(-log_a): no cancellation as a -> 1.
            u = jnp.sqrt((1.0 + a * a) * jnp.tanh(-log_a)) * (gate_i * x)
            outs = []
            for j in range(_GROUP):
                h = a[j:j + 1, :] * h + u[j:j + 1, :]
                outs.append(h)
            o_ref[rows, cols] = jnp.concatenate(outs, axis=0).astype(o_ref.dtype)
            return h

        h_ref[:, cols] = lax.fori_loop(0, block_t // _GROUP, group, h_ref[:, cols])
        return 0

    lax.fori_loop(0, block_d // sub_d, d_slice, 0)


@functools.partial(jax.jit, static_argnames=("block_t", "block_d", "sub_d"))
def _rg_lru(x, r, i, lam, *, block_t, block_d, sub_d):
    batch, seq, dim = x.shape
    td_spec = pl.BlockSpec((None, block_t, block_d), lambda b, j, k: (b, k, j))
    lam_spec = pl.BlockSpec((1, block_d), lambda b, j, k: (0, j))
    vmem = 8 * block_t * block_d * x.dtype.itemsize + 8 * _MiB
    return pl.pallas_call(
        functools.partial(rg_lru_kernel, sub_d=sub_d),
        grid=(batch, pl.cdiv(dim, block_d), pl.cdiv(seq, block_t)),
        in_specs=[td_spec, td_spec, td_spec, lam_spec],
        out_specs=td_spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((1, block_d), jnp.float32)],  # h, carried across time blocks
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(x, r, i, lam.reshape(1, dim))


def _channel_block(dim):
    """The widest multiple of 128 up to BLOCK_D that divides the channels rounded up to 128."""
    tiles = _round_up(dim, 128) // 128
    k = max(k for k in range(1, tiles + 1) if tiles % k == 0 and k * 128 <= max(BLOCK_D, 128))
    return k * 128


def kernel(x, r, i, lam):
    batch, seq, dim = x.shape
    if r.shape != x.shape or i.shape != x.shape or lam.shape != (dim,):
        raise ValueError(f"expected x, r, i [b, t, d] and lam [d]; got {x.shape=} {r.shape=} "
                         f"{i.shape=} {lam.shape=}")
    block_t = min(BLOCK_T, _round_up(seq, _GROUP))
    block_d = _channel_block(dim)
    sub_d = next(s for s in (512, 256, 128) if block_d % s == 0)
    return _rg_lru(x, r, i, lam, block_t=block_t, block_d=block_d, sub_d=sub_d)
