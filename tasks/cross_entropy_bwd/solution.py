"""Row-tiled cross-entropy backward: each grid step turns a [block_rows, V] slab of whole logit
rows into (softmax - onehot(labels)) / M, computed in float32.

Rows are independent, so the single grid axis is "parallel". A whole vocabulary row stays in
VMEM (a float32 row of Qwen2's 151936 logits is 594 KiB), so the logits are read once and the
gradient written once: max, exp and sum over the row, then the scaled probabilities minus 1/M
at the label's column. The labels come as a [block_rows, 1] int32 block beside the logits.

Block rows: up to BLOCK_ROWS, fewer where a float32 slab of the row block would pass
_F32_SLAB_BYTES (the exp and the output are float32 temporaries of that size), and never fewer
than one sublane tile; the scoped VMEM limit is raised to what the double-buffered blocks and
those temporaries take. A row count that is not a multiple of the block leaves a ragged last
block whose padding rows are computed on whatever the buffer holds and never written back; a
vocabulary that is no multiple of 128 is a full-width block, legal as the array's own dim.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 128  # tune: 32, 64, 128, 256  (rows per block, at most; a multiple of 16)
_F32_SLAB_BYTES = 8 << 20           # one row block as float32, at most (unless one tile is more)
_MIB = 1 << 20
_VMEM_CAP = 100 * _MIB


def cross_entropy_bwd_kernel(logits_ref, labels_ref, dlogits_ref, *, inv_m):
    x = logits_ref[...].astype(jnp.float32)                          # [br, V]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))              # <= 1: cannot overflow
    scale = inv_m / jnp.sum(e, axis=-1, keepdims=True)               # [br, 1], 1 / (M * sum)
    col = lax.broadcasted_iota(jnp.int32, e.shape, 1)
    onehot = jnp.where(col == labels_ref[...], inv_m, 0.0)           # labels: [br, 1]
    dlogits_ref[...] = (e * scale - onehot).astype(dlogits_ref.dtype)


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block_rows(m, v, dtype):
    sublane = 8 * max(1, 4 // jnp.dtype(dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = min(BLOCK_ROWS, _F32_SLAB_BYTES // (4 * v)) // sublane * sublane
    cap = max(sublane, cap)
    return m if m <= cap else cap  # the full row count is always a legal block


def _vmem_bytes(br, v, itemsize):
    lanes = _round_up(v, 128)
    return (4 * br * lanes * itemsize   # logits and dlogits blocks, double-buffered
            + 2 * br * 128 * 4          # the labels block (one lane-padded column), double-buffered
            + 4 * br * lanes * 4)       # float32 temporaries: x, e, the iota/one-hot, the output


@functools.partial(jax.jit, static_argnames=("br",))
def _cross_entropy_bwd(logits, labels, *, br):
    m, v = logits.shape
    vmem = _vmem_bytes(br, v, logits.dtype.itemsize)
    row_block = pl.BlockSpec((br, v), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(cross_entropy_bwd_kernel, inv_m=1.0 / m),
        grid=(pl.cdiv(m, br),),
        in_specs=[row_block, pl.BlockSpec((br, 1), lambda i: (i, 0))],
        out_specs=row_block,
        out_shape=jax.ShapeDtypeStruct((m, v), logits.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",),
            vmem_limit_bytes=int(min(max(vmem + 8 * _MIB, 32 * _MIB), _VMEM_CAP))),
    )(logits, labels.reshape(m, 1))


def kernel(logits, labels):
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"expected logits[M, V] and labels[M]; got {logits.shape=}, {labels.shape=}")
    m, v = logits.shape
    br = _block_rows(m, v, logits.dtype)
    if _vmem_bytes(br, v, jnp.dtype(logits.dtype).itemsize) > _VMEM_CAP:
        raise ValueError(f"a block of {br} whole rows of {v=} logits does not fit VMEM "
                         f"({_VMEM_CAP // _MIB} MiB); this kernel keeps whole rows resident")
    return _cross_entropy_bwd(logits, labels.astype(jnp.int32), br=br)
