"""Causal attention backward as three pallas_calls: a delta pre-pass, a dk/dv kernel and a
separate dq kernel (the FlashAttention-2 split), each reducing over its own grid axis.

1. delta kernel, grid (batch, heads, q blocks): delta = sum(o * do, -1) per query, written as a
   [seq, 1] f32 column (a lane reduction, keepdims).
2. dk/dv kernel, grid (batch, heads, kv blocks, q blocks), the q axis "arbitrary": each step
   recomputes s = q k^T * scale [BQ, BK] in the natural (query-major) orientation, with lse and
   delta as [BQ, 1] columns, and accumulates dv += p^T do and dk += dS^T q in f32 VMEM scratch;
   the kv block's dk, dv are written at the last q block.
3. dq kernel, grid (batch, heads, q blocks, kv blocks), the kv axis "arbitrary": recomputes p and
   dS the same way and accumulates dq += dS k in f32 VMEM scratch, written at the last kv block.
Every grid step handles exactly one (q block, kv block) pair; there is no in-kernel loop.
Causal: q and kv blocks are square, so the pair (i, j) is live iff i >= j; dead steps are
skipped with pl.when and their index maps are clamped to the nearest live block (no new copy);
the element-wise mask (key <= query) is applied on every live pair (exact on the diagonal, a
no-op below it).

Ragged sequences are padded in the wrapper (not masked in the kernel): q, k, v, o, do and lse
are zero-padded to a multiple of the block. Padded keys lie after every real query, so the
causal mask removes them (and with k = v = 0 they could add nothing to dq anyway); a padded
query has q = do = 0, so it adds nothing to dk
(dS = p * (do v^T - delta) = 0) or dv (p^T do = 0). The padded rows of dq, dk, dv are sliced off.

f32 inputs run every matmul at full f32 precision (p = exp(s - lse) needs accurate logits).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_CAUSAL = True
_MASK_VALUE = -1e30
_NT = (((1,), (1,)), ((), ()))  # A @ B^T
_TN = (((0,), (0,)), ((), ()))  # A^T @ B
_NN = (((1,), (0,)), ((), ()))  # A @ B
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _delta_kernel(o_ref, do_ref, delta_ref):
    od = o_ref[...].astype(jnp.float32) * do_ref[...].astype(jnp.float32)
    delta_ref[...] = jnp.sum(od, axis=-1, keepdims=True)


def _probs_and_ds(q, k, v, do, lse, delta, qi, kj, scale):
    """p and dS [BQ, BK] of one (q block, kv block) pair, s in query-major orientation."""
    s = _dot(q, k, _NT) * scale
    if _CAUSAL:
        bq, bk = s.shape
        query = qi * bq + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        key = kj * bk + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key <= query, s, _MASK_VALUE)
    p = jnp.exp(s - lse)                       # [BQ, BK]
    dp = _dot(do, v, _NT)                      # [BQ, BK]
    ds = p * (dp - delta)
    return p, ds


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                dk_acc, dv_acc, *, scale):
    kj, qi = pl.program_id(2), pl.program_id(3)

    @pl.when(qi == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    def step():
        q, do = q_ref[...], do_ref[...]
        p, ds = _probs_and_ds(q, k_ref[...], v_ref[...], do, lse_ref[...], delta_ref[...],
                              qi, kj, scale)
        dv_acc[...] += _dot(p.astype(do.dtype), do, _TN)   # p^T do   [BK, D]
        dk_acc[...] += _dot(ds.astype(q.dtype), q, _TN)    # dS^T q   [BK, D]

    if _CAUSAL:
        pl.when(qi >= kj)(step)   # blocks are square: q block qi sees kv block kj iff qi >= kj
    else:
        step()

    @pl.when(qi == pl.num_programs(3) - 1)
    def _write():
        dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_acc, *, scale):
    qi, kj = pl.program_id(2), pl.program_id(3)

    @pl.when(kj == 0)
    def _init():
        dq_acc[...] = jnp.zeros_like(dq_acc)

    def step():
        k = k_ref[...]
        _, ds = _probs_and_ds(q_ref[...], k, v_ref[...], do_ref[...], lse_ref[...],
                              delta_ref[...], qi, kj, scale)
        dq_acc[...] += _dot(ds.astype(k.dtype), k, _NN)    # dS k   [BQ, D]

    if _CAUSAL:
        pl.when(kj <= qi)(step)
    else:
        step()

    @pl.when(kj == pl.num_programs(3) - 1)
    def _write():
        dq_ref[...] = (dq_acc[...] * scale).astype(dq_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block",))
def _attention_bwd(q, k, v, o, lse, do, *, block):
    batch, heads, seq, d = q.shape
    seq_p = _round_up(seq, block)
    pad = ((0, 0), (0, 0), (0, seq_p - seq), (0, 0))
    q, k, v, o, do = (jnp.pad(x, pad) for x in (q, k, v, o, do))
    lse_col = jnp.pad(lse.astype(jnp.float32)[..., None], pad)   # [b, h, seq_p, 1]
    n = seq_p // block
    scale = d ** -0.5
    sq = pl.squeezed
    itemsize = q.dtype.itemsize
    vmem = int(min(2 * 8 * block * d * itemsize + 2 * block * d * 4 + 12 * block * block * 4
                   + 8 * _MiB, 100 * _MiB))

    # 1. delta
    row_blk = pl.BlockSpec((sq, sq, block, d), lambda b, h, i: (b, h, i, 0))
    col_blk = pl.BlockSpec((sq, sq, block, 1), lambda b, h, i: (b, h, i, 0))
    delta = pl.pallas_call(
        _delta_kernel,
        grid=(batch, heads, n),
        in_specs=[row_blk, row_blk],
        out_specs=col_blk,
        out_shape=jax.ShapeDtypeStruct((batch, heads, seq_p, 1), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")),
    )(o, do)

    # Causal: clamp the block a skipped step would fetch to one the neighbouring step uses, so
    # skipped steps start no new copies.
    if _CAUSAL:
        q_of_kv_grid = lambda b, h, j, i: (b, h, jnp.maximum(i, j), 0)
        k_of_q_grid = lambda b, h, i, j: (b, h, jnp.minimum(i, j), 0)
    else:
        q_of_kv_grid = lambda b, h, j, i: (b, h, i, 0)
        k_of_q_grid = lambda b, h, i, j: (b, h, j, 0)

    # 2. dk, dv: grid (b, h, kv block j, q block i)
    kv_fixed = pl.BlockSpec((sq, sq, block, d), lambda b, h, j, i: (b, h, j, 0))
    q_moving = pl.BlockSpec((sq, sq, block, d), q_of_kv_grid)
    q_moving_col = pl.BlockSpec((sq, sq, block, 1), q_of_kv_grid)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale),
        grid=(batch, heads, n, n),
        in_specs=[q_moving, kv_fixed, kv_fixed, q_moving, q_moving_col, q_moving_col],
        out_specs=[kv_fixed, kv_fixed],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)] * 2,
        scratch_shapes=[pltpu.VMEM((block, d), jnp.float32), pltpu.VMEM((block, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=vmem),
    )(q, k, v, do, lse_col, delta)

    # 3. dq: grid (b, h, q block i, kv block j)
    q_fixed = pl.BlockSpec((sq, sq, block, d), lambda b, h, i, j: (b, h, i, 0))
    q_fixed_col = pl.BlockSpec((sq, sq, block, 1), lambda b, h, i, j: (b, h, i, 0))
    kv_moving = pl.BlockSpec((sq, sq, block, d), k_of_q_grid)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale),
        grid=(batch, heads, n, n),
        in_specs=[q_fixed, kv_moving, kv_moving, q_fixed, q_fixed_col, q_fixed_col],
        out_specs=q_fixed,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((block, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=vmem),
    )(q, k, v, do, lse_col, delta)
    return tuple(x[:, :, :seq] for x in (dq, dk, dv))


def _block_for(seq):
    seq_p = _round_up(seq, 128)
    for block in (512, 256):
        if seq_p % block == 0:
            return block
    return 128


def kernel(q, k, v, o, lse, do):
    if q.ndim != 4 or any(x.shape != q.shape for x in (k, v, o, do)) or lse.shape != q.shape[:3]:
        raise ValueError(f"shape mismatch: {q.shape=} {k.shape=} {v.shape=} {o.shape=} "
                         f"{lse.shape=} {do.shape=}")
    return _attention_bwd(q, k, v, o, lse, do, block=_block_for(q.shape[2]))
