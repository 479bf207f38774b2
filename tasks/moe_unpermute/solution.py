"""MoE combine: each token's k expert-output rows gathered by a scalar counting sort's positions
and mixed by its router weights in float32.

The expert indices, flattened to idx[t * k] (a free reshape), are scalar-prefetched into SMEM.
Grid (token blocks of BLOCK_T,), "arbitrary": step 0 computes, on the scalar unit, the row
every (token, slot) pair was dispatched to, pos[r], in SMEM scratch: it counts the pairs of each
expert, sets each expert's cursor to its first row (the exclusive prefix sum of the counts),
and walks the pairs in index order (token, then slot), each taking its expert's next row. That
is moe_permute's stable order, inverted as it is built.

Each step gathers, for its tokens, the k rows y[pos(t, j)] into a float32 buffer [k, BLOCK_T, dm]
and combines them with the weights block: out = sum_j w[:, j] * rows[j], in float32, cast to
y.dtype and written back by the pipeline.

- float32 y stays in HBM; one DMA per pair copies its row (a 32-bit row may start at any row).
- bfloat16 y is one VMEM-resident block (read from HBM once, single-buffered): a bf16 row cannot
  be loaded or copied at an odd row (two rows share each 32-bit word), so each row is taken from
  its aligned 16-row tile viewed as int32 [8, dm] (word [m, c] holding rows 2m and 2m + 1), its
  half moved to the high 16 bits: an exact float32 of the bf16 value. y's block is padded to 16
  rows; the padding is never selected.

Tokens past t in a ragged last block take pair t * k - 1's rows (clamped): finite values whose
output rows the pipeline never writes back.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_T = 128  # tune: 32, 64, 128, 256  (tokens per grid step)
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def unpermute_kernel(idx_ref, y_ref, w_ref, out_ref, cursor_ref, pos_ref, rows_ref, sem, *,
                     experts, k, block_t, resident):
    b = pl.program_id(0)
    pairs = idx_ref.shape[0]

    @pl.when(b == 0)
    def _positions():
        def zero(x, carry):
            cursor_ref[x] = 0
            return carry

        lax.fori_loop(0, experts, zero, 0)

        def tally(r, carry):
            x = idx_ref[r]
            cursor_ref[x] = cursor_ref[x] + 1
            return carry

        lax.fori_loop(0, pairs, tally, 0)

        def first_row(x, row):
            n = cursor_ref[x]
            cursor_ref[x] = row
            return row + n

        lax.fori_loop(0, experts, first_row, 0)

        def place(r, carry):  # pairs in index order: moe_permute's stable order
            x = idx_ref[r]
            row = cursor_ref[x]
            cursor_ref[x] = row + 1
            pos_ref[r] = row
            return carry

        lax.fori_loop(0, pairs, place, 0)

    def pair_row(i, j):
        return pos_ref[jnp.minimum((b * block_t + i) * k + j, pairs - 1)]

    if resident:  # bf16 y in VMEM: rows picked out of their packed tiles
        word_row = lax.broadcasted_iota(jnp.int32, (8, 1), 0)

        def gather(i, carry):
            for j in range(k):
                src = pair_row(i, j)
                tile = y_ref[pl.ds(pl.multiple_of(lax.div(src, 16) * 16, 16), 16), :]
                words = pltpu.bitcast(tile, jnp.int32)                     # [8, dm]
                pick = word_row == lax.div(lax.rem(src, 16), 2)
                w = jnp.sum(jnp.where(pick, words, 0), axis=0, keepdims=True)
                bits = jnp.where(lax.rem(src, 2) == 1, w & jnp.int32(-65536), w << 16)
                rows_ref[j, pl.ds(i, 1), :] = pltpu.bitcast(bits, jnp.float32)
            return carry

        lax.fori_loop(0, block_t, gather, 0)
    else:  # f32 y in HBM: one row DMA per pair
        def row_copy(i, j, src):
            return pltpu.make_async_copy(y_ref.at[pl.ds(src, 1)], rows_ref.at[j, pl.ds(i, 1)],
                                         sem.at[0])

        def start(i, carry):
            for j in range(k):
                row_copy(i, j, pair_row(i, j)).start()
            return carry

        lax.fori_loop(0, block_t, start, 0)

        def wait(i, carry):
            for j in range(k):
                row_copy(0, 0, 0).wait()  # each copy moves one row
            return carry

        lax.fori_loop(0, block_t, wait, 0)

    acc = w_ref[:, 0:1] * rows_ref[0]
    for j in range(1, k):
        acc = acc + w_ref[:, j:j + 1] * rows_ref[j]
    out_ref[...] = acc.astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("experts", "block_t"))
def _unpermute(y, idx, w, *, experts, block_t):
    tokens, k = idx.shape
    pairs, dm = y.shape
    resident = y.dtype.itemsize == 2
    itemsize = y.dtype.itemsize
    if resident:
        y_rows = _round_up(pairs, 16)
        y_spec = pl.BlockSpec((y_rows, dm), lambda b, idx: (0, 0), pipeline_mode=pl.Buffered(1))
        y_vmem = y_rows * dm * itemsize
    else:
        y_spec = pl.BlockSpec(memory_space=pl.ANY)
        y_vmem = 0
    vmem = (y_vmem + k * block_t * dm * 4 + 2 * block_t * dm * itemsize + 4 * block_t * dm * 4
            + 8 * _MiB)
    return pl.pallas_call(
        functools.partial(unpermute_kernel, experts=experts, k=k, block_t=block_t,
                          resident=resident),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(pl.cdiv(tokens, block_t),),
            in_specs=[y_spec, pl.BlockSpec((block_t, k), lambda b, idx: (b, 0))],
            out_specs=pl.BlockSpec((block_t, dm), lambda b, idx: (b, 0)),
            scratch_shapes=[pltpu.SMEM((experts,), jnp.int32),          # each expert's next row
                            pltpu.SMEM((pairs,), jnp.int32),            # pos: pair -> row of y
                            pltpu.VMEM((k, block_t, dm), jnp.float32),  # the gathered rows
                            pltpu.SemaphoreType.DMA((1,))],
        ),
        out_shape=jax.ShapeDtypeStruct((tokens, dm), y.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=int(min(max(vmem, 32 * _MiB), 110 * _MiB))),
    )(idx.reshape(-1).astype(jnp.int32), y, w.astype(jnp.float32))


def kernel(y, idx, w, experts):
    pairs, dm = y.shape
    tokens, k = idx.shape
    if pairs != tokens * k or w.shape != idx.shape or experts.ndim != 1:
        raise ValueError(f"expected y[t * k, dm], idx[t, k], w[t, k], experts[e]; got {y.shape=} "
                         f"{idx.shape=} {w.shape=} {experts.shape=}")
    if y.dtype.itemsize not in (2, 4):
        raise ValueError(f"y must be a 16- or 32-bit float, got {y.dtype}")
    sublane = 8
    block_t = tokens if tokens <= BLOCK_T else max(sublane, BLOCK_T // sublane * sublane)
    return _unpermute(y, idx, w, experts=int(experts.shape[0]), block_t=block_t)
