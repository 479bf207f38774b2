"""Unstable dispatch order: an MoE permute kernel (scalar counting sort in SMEM, rows gathered
from a VMEM-resident x into aligned output blocks) whose placement pass walks the pairs slot by
slot (every token's first choice, then every token's second), so an expert's rows come out
ordered by slot, then token, where the task (and the grouped matmul's consumer, moe_unpermute)
sorts stably by the pair index token * k + slot: ties by token, then slot. The counts are right
and every row is some token's row of the right expert; only the order inside each expert's
group is wrong, whenever an expert is some tokens' first choice and other earlier tokens'
second.
task: moe_permute  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_R = 256  # tune: 64, 128, 256, 512  (output rows per grid step)
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def permute_kernel(idx_ref, x_ref, out_ref, counts_ref, cursor_ref, src_ref, *stage, k, block_r):
    b = pl.program_id(0)
    experts = counts_ref.shape[0]
    pairs = idx_ref.shape[0]

    @pl.when(b == 0)
    def _gather_table():
        def zero(x, carry):
            counts_ref[x] = 0
            return carry

        lax.fori_loop(0, experts, zero, 0)

        def tally(r, carry):
            x = idx_ref[r]
            counts_ref[x] = counts_ref[x] + 1
            return carry

        lax.fori_loop(0, pairs, tally, 0)

        def first_row(x, row):
            cursor_ref[x] = row
            return row + counts_ref[x]

        lax.fori_loop(0, experts, first_row, 0)

        tokens = pairs // k

        def place(q, carry):  # slot-major: pair (token q % t, slot q // t)
            r = lax.rem(q, tokens) * k + lax.div(q, tokens)
            x = idx_ref[r]
            row = cursor_ref[x]
            cursor_ref[x] = row + 1
            src_ref[row] = lax.div(r, k)
            return carry

        lax.fori_loop(0, pairs, place, 0)

    packed = bool(stage)  # static: a 16-bit dtype, read through an int32 view
    word_row = lax.broadcasted_iota(jnp.int32, (8, 1), 0)

    def fill(r, carry):
        src = src_ref[jnp.minimum(b * block_r + r, pairs - 1)]  # rows past t * k: never written
        if packed:
            tile = x_ref[pl.ds(pl.multiple_of(lax.div(src, 16) * 16, 16), 16), :]
            words = pltpu.bitcast(tile, jnp.int32)                  # [8, dm]: row pairs
            pick = word_row == lax.div(lax.rem(src, 16), 2)
            w = jnp.sum(jnp.where(pick, words, 0), axis=0, keepdims=True)
            bits = jnp.where(lax.rem(src, 2) == 1, w & jnp.int32(-65536), w << 16)
            stage[0][pl.ds(r, 1), :] = pltpu.bitcast(bits, jnp.float32)
        else:
            out_ref[pl.ds(r, 1), :] = x_ref[pl.ds(src, 1), :]
        return carry

    lax.fori_loop(0, block_r, fill, 0)
    if packed:
        out_ref[...] = stage[0][...].astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("experts", "block_r"))
def _permute(x, idx, *, experts, block_r):
    tokens, dm = x.shape
    k = idx.shape[1]
    pairs = tokens * k
    packed = x.dtype.itemsize == 2
    x_rows = _round_up(tokens, 16) if packed else tokens
    itemsize = x.dtype.itemsize
    stage = [pltpu.VMEM((block_r, dm), jnp.float32)] if packed else []
    vmem = x_rows * dm * itemsize + 2 * block_r * dm * itemsize + block_r * dm * 4 + 8 * _MiB
    return pl.pallas_call(
        functools.partial(permute_kernel, k=k, block_r=block_r),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(pl.cdiv(pairs, block_r),),
            in_specs=[pl.BlockSpec((x_rows, dm), lambda b, idx: (0, 0),
                                   pipeline_mode=pl.Buffered(1))],
            out_specs=(pl.BlockSpec((block_r, dm), lambda b, idx: (b, 0)),
                       pl.BlockSpec(memory_space=pltpu.SMEM)),
            scratch_shapes=[pltpu.SMEM((experts,), jnp.int32),   # each expert's next row
                            pltpu.SMEM((pairs,), jnp.int32),     # src: output row -> token
                            *stage],
        ),
        out_shape=(jax.ShapeDtypeStruct((pairs, dm), x.dtype),
                   jax.ShapeDtypeStruct((experts,), jnp.int32)),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int(min(max(vmem, 32 * _MiB), 110 * _MiB))),
    )(idx.reshape(-1).astype(jnp.int32), x)


def kernel(x, idx, experts):
    tokens, dm = x.shape
    if idx.ndim != 2 or idx.shape[0] != tokens or experts.ndim != 1:
        raise ValueError(f"expected x[t, dm], idx[t, k], experts[e]; got {x.shape=} {idx.shape=} "
                         f"{experts.shape=}")
    if x.dtype.itemsize not in (2, 4):
        raise ValueError(f"x must be a 16- or 32-bit float, got {x.dtype}")
    pairs = tokens * idx.shape[1]
    block_r = pairs if pairs <= BLOCK_R else BLOCK_R
    return _permute(x, idx, experts=int(experts.shape[0]), block_r=block_r)
