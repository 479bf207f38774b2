"""Causal flash-attention backward: two Pallas kernels that recompute p = exp(s - lse) and skip
the blocks above the diagonal.

delta = sum(o * do, -1) (an O(seq * head_dim) row sum) is computed in the wrapper. Then:

- dk/dv kernel, grid (batch, heads, kv blocks, q blocks): for one kv block it walks the q blocks,
  recomputing the transposed logits s^T = k q^T * scale and p^T = exp(s^T - lse), and accumulates
  dv += p^T do and dk += dS^T q in f32 VMEM scratch, where dS^T = p^T * (v do^T - delta).
  Only q blocks at or after the kv block's diagonal see its keys: the earlier ones are skipped,
  and their index map points at the first needed q block, so nothing is fetched for them.
- dq kernel, grid (batch, heads, q blocks, kv blocks): for one q block it walks the kv blocks and
  accumulates dq += dS k; kv blocks after the diagonal are skipped, their index map clamped to the
  last needed one.

Only blocks that cross the diagonal pay for the element-wise mask. Working on s^T in the dk/dv
kernel keeps every matmul in the A @ B or A @ B^T form and lets lse and delta enter as lane-major
rows [1, block_q]; the dq kernel takes them as columns [block_q, 1].

A sequence that is not a multiple of the block is padded at the end. Padded keys come after every
real query, so the causal mask hides them. Padded query rows have q = do = 0 and lse = delta = 0,
so their p = exp(0) = 1 is finite and their p^T do and dS terms are exactly zero; their dq rows
are sliced off.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - lse) == 0.
_MASK_VALUE = -1e30
_NN = (((1,), (0,)), ((), ()))  # A @ B
_NT = (((1,), (1,)), ((), ()))  # A @ B^T: contract the last dim of both operands


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block_size(seq):
    """Rows per q and kv block: 512 for long sequences (fewer steps, full MXU tiles), else 128."""
    return 512 if seq >= 1024 else 128


def _dot(a, b, dims):
    """a @ b (or a @ b^T) with f32 accumulation.

    f32 operands ask for full f32 precision: p = exp(s - lse) compares recomputed logits with a
    given lse, so logits from bf16-rounded operands would be off by up to |s| * 2**-8 in the
    exponent. bf16 operands multiply exactly with f32 accumulation either way.
    """
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _block_relation(q_start, k_start, block_q, block_k):
    """(needed, crosses_diagonal) for the (q block, kv block) pair starting at these positions.

    needed: some key of the kv block is visible to some query of the q block (its first key is at
    or before the q block's last query). crosses_diagonal: some key is invisible to some query
    (its last key is after the q block's first query), so the element-wise mask is needed.
    """
    needed = k_start <= q_start + block_q - 1
    crosses_diagonal = k_start + block_k - 1 > q_start
    return needed, crosses_diagonal


def dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                dk_acc, dv_acc, *, scale, block_q, block_k):
    kv = pl.program_id(2)
    qi = pl.program_id(3)
    k_start = kv * block_k
    q_start = qi * block_q

    @pl.when(qi == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    def _update(masked):
        q = q_ref[...]    # [block_q, d]
        k = k_ref[...]    # [block_k, d]
        v = v_ref[...]    # [block_k, d]
        do = do_ref[...]  # [block_q, d]
        s_t = _dot(k, q, _NT) * scale  # [bk, bq]
        if masked:
            key = k_start + lax.broadcasted_iota(jnp.int32, s_t.shape, 0)
            query = q_start + lax.broadcasted_iota(jnp.int32, s_t.shape, 1)
            s_t = jnp.where(key <= query, s_t, _MASK_VALUE)
        p_t = jnp.exp(s_t - lse_ref[...])  # lse row [1, bq]
        dv_acc[...] += _dot(p_t.astype(do.dtype), do, _NN)
        dp_t = _dot(v, do, _NT)  # [bk, bq]
        ds_t = p_t * (dp_t - delta_ref[...])  # delta row [1, bq]
        dk_acc[...] += _dot(ds_t.astype(q.dtype), q, _NN)

    needed, crosses = _block_relation(q_start, k_start, block_q, block_k)

    @pl.when(needed & crosses)
    def _diagonal_block():
        _update(masked=True)

    @pl.when(needed & jnp.logical_not(crosses))
    def _full_block():
        _update(masked=False)

    # The last q block sees every kv block, so this step always runs after the updates.
    @pl.when(qi == pl.num_programs(3) - 1)
    def _store():
        dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_acc, *,
              scale, block_q, block_k):
    qi = pl.program_id(2)
    kv = pl.program_id(3)
    q_start = qi * block_q
    k_start = kv * block_k

    @pl.when(kv == 0)
    def _init():
        dq_acc[...] = jnp.zeros_like(dq_acc)

    def _update(masked):
        q = q_ref[...]    # [block_q, d]
        k = k_ref[...]    # [block_k, d]
        v = v_ref[...]    # [block_k, d]
        do = do_ref[...]  # [block_q, d]
        s = _dot(q, k, _NT) * scale  # [bq, bk]
        if masked:
            query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            key = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(key <= query, s, _MASK_VALUE)
        p = jnp.exp(s - lse_ref[...])  # lse column [bq, 1]
        dp = _dot(do, v, _NT)  # [bq, bk]
        ds = p * (dp - delta_ref[...])  # delta column [bq, 1]
        dq_acc[...] += _dot(ds.astype(k.dtype), k, _NN)

    needed, crosses = _block_relation(q_start, k_start, block_q, block_k)

    @pl.when(needed & crosses)
    def _diagonal_block():
        _update(masked=True)

    @pl.when(needed & jnp.logical_not(crosses))
    def _full_block():
        _update(masked=False)

    @pl.when(kv == pl.num_programs(3) - 1)
    def _store():
        dq_ref[...] = (dq_acc[...] * scale).astype(dq_ref.dtype)


# lax.div (C-style) rather than //: the operands are non-negative, and floor division's sign
# fix-up would make the index maps depend on the TPU generation when lowering.
def _first_q_block(kv_block, block_q, block_k):
    """Index of the first q block with a query that sees a key of kv block `kv_block`."""
    return lax.div(kv_block * block_k, block_q)


def _last_kv_block(q_block, block_q, block_k):
    """Index of the last kv block with a key visible to a query of q block `q_block`."""
    return lax.div((q_block + 1) * block_q - 1, block_k)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _causal_attention_bwd(q, k, v, o, lse, do, *, block_q, block_k):
    batch, heads, seq, head_dim = q.shape
    scale = head_dim ** -0.5
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)  # [b, h, s]
    lse = lse.astype(jnp.float32)
    seq_pad = _round_up(seq, max(block_q, block_k))
    if seq_pad != seq:
        pad = ((0, 0), (0, 0), (0, seq_pad - seq), (0, 0))
        q, k, v, do = (jnp.pad(x, pad) for x in (q, k, v, do))
        lse, delta = (jnp.pad(x, pad[:3]) for x in (lse, delta))
    # Rows [b, h, 1, s] for the dk/dv kernel, columns [b, h, s, 1] for the dq kernel.
    lse_row, delta_row = lse[:, :, None, :], delta[:, :, None, :]
    lse_col, delta_col = lse[..., None], delta[..., None]
    num_q, num_k = seq_pad // block_q, seq_pad // block_k
    params = dict(scale=scale, block_q=block_q, block_k=block_k)
    sq = pl.squeezed

    # dk, dv: grid (b, h, kv block j, q block i), i innermost. Skipped q blocks (before the
    # diagonal) repeat the first needed one: same block index, so no new DMA.
    def q_side(b, h, j, i):
        return jnp.maximum(i, _first_q_block(j, block_q, block_k))

    q_blk = pl.BlockSpec((sq, sq, block_q, head_dim), lambda b, h, j, i: (b, h, q_side(b, h, j, i), 0))
    kv_blk = pl.BlockSpec((sq, sq, block_k, head_dim), lambda b, h, j, i: (b, h, j, 0))
    row_blk = pl.BlockSpec((sq, sq, 1, block_q), lambda b, h, j, i: (b, h, 0, q_side(b, h, j, i)))
    dk, dv = pl.pallas_call(
        functools.partial(dkdv_kernel, **params),
        grid=(batch, heads, num_k, num_q),
        in_specs=[q_blk, kv_blk, kv_blk, q_blk, row_blk, row_blk],
        out_specs=[kv_blk, kv_blk],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((block_k, head_dim), jnp.float32),   # dk accumulator
                        pltpu.VMEM((block_k, head_dim), jnp.float32)],  # dv accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v, do, lse_row, delta_row)

    # dq: grid (b, h, q block i, kv block j), j innermost. Skipped kv blocks (after the diagonal)
    # repeat the last needed one.
    def kv_side(b, h, i, j):
        return jnp.minimum(j, _last_kv_block(i, block_q, block_k))

    q_blk = pl.BlockSpec((sq, sq, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0))
    kv_blk = pl.BlockSpec((sq, sq, block_k, head_dim), lambda b, h, i, j: (b, h, kv_side(b, h, i, j), 0))
    col_blk = pl.BlockSpec((sq, sq, block_q, 1), lambda b, h, i, j: (b, h, i, 0))
    dq = pl.pallas_call(
        functools.partial(dq_kernel, **params),
        grid=(batch, heads, num_q, num_k),
        in_specs=[q_blk, kv_blk, kv_blk, q_blk, col_blk, col_blk],
        out_specs=q_blk,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)],  # dq accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v, do, lse_col, delta_col)
    return tuple(x[:, :, :seq, :] for x in (dq, dk, dv))


def kernel(q, k, v, o, lse, do):
    if q.ndim != 4 or any(x.shape != q.shape for x in (k, v, o, do)) or lse.shape != q.shape[:3]:
        raise ValueError(f"expected q, k, v, o, do of one shape [batch, heads, seq, head_dim] and "
                         f"lse [batch, heads, seq], got {q.shape=} {k.shape=} {v.shape=} "
                         f"{o.shape=} {lse.shape=} {do.shape=}")
    block = _block_size(q.shape[2])
    return _causal_attention_bwd(q, k, v, o, lse, do, block_q=block, block_k=block)
