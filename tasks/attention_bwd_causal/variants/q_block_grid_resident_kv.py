"""Causal attention backward, one fused kernel whose grid walks QUERY blocks: the reverse of
looping queries inside a kv-block grid.

Grid (batch, heads, q blocks): batch and heads "parallel", the q axis "arbitrary" (it is the
reduction axis of dk and dv). Each step takes one [BLOCK_Q, head_dim] block of q, o and do and
its lse as a [BLOCK_Q, 1] column; k and v are whole-head blocks (index maps ignore the q axis:
fetched once per head) and dk, dv are whole-head output blocks accumulated in f32 VMEM scratch
across the q blocks and written at the head's last q block.

Inside a step, delta = sum(o * do, -1) is computed as a [BLOCK_Q, 1] column (a lane reduction),
then a lax.fori_loop walks the key tiles of TILE_K rows with dq as the loop carry, in the
natural query-major orientation s = q k^T * scale [BLOCK_Q, TILE_K]:
    p = exp(s - lse),  dp = do v^T,  dS = p * (dp - delta),
    dq += dS k,  dv[tile] += p^T do,  dk[tile] += dS^T q.
dq is complete at the end of the loop and written straight to its output block; dk and dq take
the softmax scale once at the end.
Causal: the loop runs only over the key tiles holding a key at or before the block's last query
(a trip count that depends on the q block), and only tiles crossing the diagonal are masked.

Ragged sequences are masked inside the kernel, nothing is padded in HBM: the last q block and
the whole-head k/v blocks may overhang the arrays (rows past the sequence hold stale VMEM;
overhanging output rows are dropped on write-back). Those rows of q, o, do, lse, k and v are
zeroed with jnp.where before use (so 0 * stale never makes a NaN) and the logits of keys or
queries past the sequence are set to a large negative value, so p there is exactly 0. Only the
steps and tiles that reach past the sequence pay for the mask (lax.cond).

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
BLOCK_Q = 256  # queries per grid step
TILE_K = 512   # keys per inner-loop tile
_NT = (((1,), (1,)), ((), ()))  # A @ B^T
_TN = (((0,), (0,)), ((), ()))  # A^T @ B
_NN = (((1,), (0,)), ((), ()))  # A @ B
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _zero_past(x, start, limit):
    """x with its rows start + r >= limit set to zero."""
    row = start + lax.broadcasted_iota(jnp.int32, x.shape, 0)
    return jnp.where(row < limit, x, jnp.zeros_like(x))


def _bwd_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, do_ref, dq_ref, dk_ref, dv_ref,
                dk_acc, dv_acc, *, scale, seq_len, tile_k):
    block_q, d = q_ref.shape
    kv_rows = k_ref.shape[0]
    n_tiles = kv_rows // tile_k
    qi = pl.program_id(2)
    q_start = qi * block_q

    @pl.when(qi == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    q, o, do, lse = q_ref[...], o_ref[...], do_ref[...], lse_ref[...]
    if seq_len % block_q:  # static: the last q block overhangs the sequence
        q, o, do, lse = lax.cond(
            q_start + block_q > seq_len,
            lambda *xs: tuple(_zero_past(x, q_start, seq_len) for x in xs),
            lambda *xs: xs, q, o, do, lse)
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1,
                    keepdims=True)  # [block_q, 1]

    def tile(t, dq):
        k_start = t * tile_k
        rows = pl.ds(pl.multiple_of(k_start, tile_k), tile_k)
        k, v = k_ref[rows, :], v_ref[rows, :]
        if kv_rows > seq_len:  # static: some key tile overhangs the sequence
            k, v = lax.cond(k_start + tile_k > seq_len,
                            lambda k, v: (_zero_past(k, k_start, seq_len),
                                          _zero_past(v, k_start, seq_len)),
                            lambda k, v: (k, v), k, v)
        s = _dot(q, k, _NT) * scale  # [block_q, tile_k]

        def mask(s):
            query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            key = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            ok = (key < seq_len) & (query < seq_len)
            if _CAUSAL:
                ok &= key <= query
            return jnp.where(ok, s, _MASK_VALUE)

        needs_mask = (k_start + tile_k > seq_len) | (q_start + block_q > seq_len)
        if _CAUSAL:  # some key of the tile comes after some query of the block
            needs_mask |= k_start + tile_k - 1 > q_start
        s = lax.cond(needs_mask, mask, lambda s: s, s)
        p = jnp.exp(s - lse)                                  # [block_q, tile_k]
        dp = _dot(do, v, _NT)
        ds = p * (dp - delta)
        dv_acc[rows, :] += _dot(p.astype(do.dtype), do, _TN)  # p^T do
        ds = ds.astype(q.dtype)
        dk_acc[rows, :] += _dot(ds, q, _TN)                   # dS^T q
        return dq + _dot(ds, k, _NN)                          # dS k

    if _CAUSAL:  # tiles holding a key at or before the block's last query
        n_live = jnp.minimum(n_tiles, lax.div(q_start + block_q + tile_k - 1, tile_k))
    else:
        n_live = n_tiles
    dq = lax.fori_loop(0, n_live, tile, jnp.zeros((block_q, d), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)

    @pl.when(qi == pl.num_programs(2) - 1)
    def _write():
        dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "tile_k"))
def _attention_bwd(q, k, v, o, lse, do, *, block_q, tile_k):
    batch, heads, seq, d = q.shape
    kv_rows = _round_up(seq, tile_k)
    n_q = pl.cdiv(seq, block_q)
    lse_col = lse.astype(jnp.float32).reshape(batch, heads, seq, 1)
    sq = pl.squeezed
    q_blk = pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i: (b, h, i, 0))
    q_col = pl.BlockSpec((sq, sq, block_q, 1), lambda b, h, i: (b, h, i, 0))
    head = pl.BlockSpec((sq, sq, kv_rows, d), lambda b, h, i: (b, h, 0, 0))
    itemsize = q.dtype.itemsize
    vmem = (2 * 4 * kv_rows * d * itemsize      # k, v, dk, dv whole-head blocks, double-buffered
            + 2 * kv_rows * d * 4               # dk, dv f32 accumulators
            + 2 * 4 * block_q * (d + 128) * 4   # q-side blocks
            + 10 * block_q * tile_k * 4 + 8 * _MiB)
    dq, dk, dv = pl.pallas_call(
        functools.partial(_bwd_kernel, scale=d ** -0.5, seq_len=seq, tile_k=tile_k),
        grid=(batch, heads, n_q),
        in_specs=[q_blk, head, head, q_blk, q_col, q_blk],
        out_specs=[q_blk, head, head],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        scratch_shapes=[pltpu.VMEM((kv_rows, d), jnp.float32),
                        pltpu.VMEM((kv_rows, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v, o, lse_col, do)
    return dq, dk, dv


def kernel(q, k, v, o, lse, do):
    if q.ndim != 4 or any(x.shape != q.shape for x in (k, v, o, do)) or lse.shape != q.shape[:3]:
        raise ValueError(f"shape mismatch: {q.shape=} {k.shape=} {v.shape=} {o.shape=} "
                         f"{lse.shape=} {do.shape=}")
    seq = _round_up(q.shape[2], 128)
    return _attention_bwd(q, k, v, o, lse, do, block_q=min(BLOCK_Q, seq),
                          tile_k=min(TILE_K, seq))
