"""Row-wise argmax with a running (best value, best index) pair carried across column chunks.

Grid: (row blocks "parallel", column chunks "arbitrary"). Each step takes a
[block_rows, BLOCK_D] tile, finds its per-row maximum and the first column holding it, and
merges that into float32 VMEM scratch: the chunk replaces the running best only where its
maximum is strictly greater. Chunks arrive left to right, so on a tie across chunks the
earlier (smaller) index is kept, and within a chunk the min over matching column positions
picks the first one: together that is jnp.argmax's first-occurrence rule. The best value is
seeded with -inf, so all-negative rows work. The last chunk writes the [block_rows, 1] int32
result. Column positions are kept in float32 for the min-reduction (exact below 2^24).

Ragged edges: lanes past d in the last chunk hold undefined data and are masked to -inf in
the kernel (every chunk has at least one real column, so the chunk max stays real). A ragged
last row block computes on rows that are never written back.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 256
BLOCK_D = 1024
VMEM_LIMIT_BYTES = 32 << 20
_NO_INDEX = float(2 ** 24)          # larger than any column position


def argmax_kernel(x_ref, idx_ref, best_val, best_idx, *, d, bd):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        best_val[...] = jnp.full(best_val.shape, -jnp.inf, jnp.float32)
        best_idx[...] = jnp.zeros(best_idx.shape, jnp.float32)

    x = x_ref[...].astype(jnp.float32)                              # [br, bd]
    col = k * bd + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)  # global column index
    if d % bd:
        x = jnp.where(col < d, x, -jnp.inf)
    chunk_max = jnp.max(x, axis=1, keepdims=True)                   # [br, 1]
    chunk_arg = jnp.min(jnp.where(x == chunk_max, col.astype(jnp.float32), _NO_INDEX),
                        axis=1, keepdims=True)

    better = chunk_max > best_val[...]          # strict: earlier chunks win ties
    best_idx[...] = jnp.where(better, chunk_arg, best_idx[...])
    best_val[...] = jnp.where(better, chunk_max, best_val[...])

    @pl.when(k == pl.num_programs(1) - 1)
    def _store():
        idx_ref[...] = best_idx[...].astype(jnp.int32)


def _block(n, cap, align):
    """cap rounded down to the alignment, or the full dim when that is smaller (always legal)."""
    cap = max(align, cap // align * align)
    return n if n <= cap else cap


@functools.partial(jax.jit, static_argnames=("br", "bd"))
def _argmax_rows(x, *, br, bd):
    rows, d = x.shape
    out = pl.pallas_call(
        functools.partial(argmax_kernel, d=d, bd=bd),
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bd)),
        in_specs=[pl.BlockSpec((br, bd), lambda i, k: (i, k))],
        out_specs=pl.BlockSpec((br, 1), lambda i, k: (i, 0)),   # resident across k
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.int32),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32),       # best value so far
                        pltpu.VMEM((br, 1), jnp.float32)],      # its column, as f32
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)
    return out.reshape(rows)


def kernel(x):
    rows, d = x.shape
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    return _argmax_rows(x, br=_block(rows, BLOCK_ROWS, sublane), bd=_block(d, BLOCK_D, 128))
