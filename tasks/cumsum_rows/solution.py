"""Row-wise inclusive prefix sum as a blocked scan: triangular matmuls on 128-lane chunks plus
a carried running total.

Grid (row blocks, column blocks); rows are "parallel", columns run in order. A [br, bc] block
is large (bc = the whole row up to BLOCK_COLS lanes, br up to BLOCK_ROWS rows and _BLOCK_BYTES)
because at bench sizes the fixed cost per grid step is what small blocks lose: bf16 8192 x 4096
takes 16 steps. Inside the block a loop walks 128-lane chunks: each chunk's prefix sums are one
MXU product x_c @ U with U[i, j] = 1 for i <= j (built from iota; 0/1 is exact in any dtype),
2 * 128 FLOPs per element whatever the block width, plus the running total of everything to
the left (f32 [br, 1]), which the chunk's last column then replaces. The total is kept across
column blocks in VMEM scratch. bf16 inputs go to the MXU as they are (exact products, f32
accumulation); f32 inputs use Precision.HIGHEST so no bf16 rounding enters the sums.

A d that is not a multiple of the block width leaves a ragged last column block: its lanes
past d are zeroed before the matmul (garbage there could be NaN, and NaN * 0 would reach real
columns); a ragged last row block needs nothing, as rows never mix. Only d < 128 is padded.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 512
BLOCK_COLS = 4096
_BLOCK_BYTES = 4 << 20          # one [br, bc] block in the input dtype, at most
_CHUNK = 128                    # lanes per triangular matmul
VMEM_LIMIT_BYTES = 64 << 20


def cumsum_kernel(x_ref, o_ref, carry_ref, *, d):
    j = pl.program_id(1)
    br, bc = x_ref.shape

    @pl.when(j == 0)
    def _init():
        carry_ref[...] = jnp.zeros_like(carry_ref)

    src = jax.lax.broadcasted_iota(jnp.int32, (_CHUNK, _CHUNK), 0)
    dst = jax.lax.broadcasted_iota(jnp.int32, (_CHUNK, _CHUNK), 1)
    upper = (src <= dst).astype(x_ref.dtype)                             # [128, 128]
    precision = jax.lax.Precision.HIGHEST if x_ref.dtype == jnp.float32 else None

    def chunk(c, carry):
        start = pl.multiple_of(c * _CHUNK, _CHUNK)
        x = x_ref[:, pl.ds(start, _CHUNK)]                               # [br, 128]
        if d % bc:  # ragged last column block: lanes past d hold padding
            lane = j * bc + start + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
            x = jnp.where(lane < d, x, jnp.zeros_like(x))
        y = jnp.dot(x, upper, precision=precision, preferred_element_type=jnp.float32)
        y = y + carry
        o_ref[:, pl.ds(start, _CHUNK)] = y.astype(o_ref.dtype)
        return y[:, _CHUNK - 1:]

    carry_ref[...] = jax.lax.fori_loop(0, bc // _CHUNK, chunk, carry_ref[...])


@functools.partial(jax.jit, static_argnames=("br", "bc"))
def _cumsum(x, *, br, bc):
    rows, d = x.shape
    return pl.pallas_call(
        functools.partial(cumsum_kernel, d=d),
        grid=(pl.cdiv(rows, br), pl.cdiv(d, bc)),
        in_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((br, bc), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x)


def kernel(x):
    rows, d = x.shape
    dp = max(d, _CHUNK)   # only a row shorter than one chunk is padded (with zeros)
    xp = jnp.pad(x, ((0, 0), (0, dp - d))) if dp != d else x
    itemsize = jnp.dtype(x.dtype).itemsize
    bc = min(BLOCK_COLS, dp // _CHUNK * _CHUNK)          # a multiple of 128, at most dp
    sublane = 8 * max(1, 4 // itemsize)                  # 8 rows for f32, 16 for bf16
    cap = max(sublane, min(BLOCK_ROWS, _BLOCK_BYTES // (itemsize * bc)) // sublane * sublane)
    br = rows if rows <= cap else cap
    out = _cumsum(xp, br=br, bc=bc)
    return out[:, :d] if dp != d else out
