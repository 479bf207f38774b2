"""MoE dispatch as a counting sort on the scalar unit and a row gather from a VMEM-resident x.

The expert indices, flattened to idx[t * k] (a free reshape), are scalar-prefetched into SMEM.
x is one block, resident in VMEM for the whole grid (constant index map, single-buffered): it is
read from HBM once. Grid (output row blocks,), "arbitrary": step 0 builds the gather table that
every step reads.

- Step 0 counts the pairs of each expert (counts[idx[r]] += 1 over the t * k indices), writes
  the counts output (SMEM), sets each expert's cursor to its first output row (the exclusive
  prefix sum of the counts), and then walks the pairs in index order (token, then slot),
  giving each the next row of its expert: src[row] = token. Walking in index order is what
  makes the sort stable.
- Every step fills its [BLOCK_R, dm] output block row by row, row r a copy of x[src[r]]; the
  pipeline writes the block back, so every output row is written once, in aligned blocks.

A bfloat16 row cannot be loaded at an arbitrary (odd) sublane: two rows share each 32-bit
word of the packed (16, 128) tile. So the source's aligned 16-row tile is loaded and viewed as
int32 ([8, dm], word [m, c] holding rows 2m and 2m + 1 at column c), the word row holding the
source is selected (a masked sum over the 8 word rows), the source's half moved to the high 16
bits (an exact float32 of the bf16 value), stored to a float32 staging block and cast back to
bf16 once per block (exact). x's block is padded to 16 rows so every tile exists for any t;
the padding is never selected.
"""
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

        def place(r, carry):  # pairs in index order: stable
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
