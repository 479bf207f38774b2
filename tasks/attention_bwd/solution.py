"""Flash-attention backward (no mask) in one Pallas kernel: dq, dk and dv from one recomputation
of p = exp(s - lse) per (key tile, query chunk) pair.

Grid (batch, heads, kv blocks): batch and heads "parallel", the kv axis "arbitrary". The
query-side operands of a head (q, do, o: [seq, head_dim]; lse: [1, seq]) and the dq output are
whole-head blocks whose index maps ignore the kv axis: they are fetched once per head and dq is
written once per head, accumulated in an f32 VMEM scratch across the kv blocks. k, v, dk and dv
move in [BLOCK_K, head_dim] blocks. Every operand is read from (or written to) HBM once.

At the head's first kv block the kernel computes delta = sum(o * do, -1) for every query as a
lane-major row [1, seq] (a ones-vector matmul, so no transpose is needed) into VMEM scratch.
Then, for each key tile of TILE_K rows, it loops over the query chunks of BLOCK_Q rows and, on
the transposed logits s^T = k q^T * scale [TILE_K, BLOCK_Q]:
    p^T = exp(s^T - lse),   dv += p^T do,   dp^T = v do^T,   dS^T = p^T * (dp^T - delta),
    dk += dS^T q,           dq[chunk] += (dS^T)^T k.
Five matmuls per pair (the reference's vjp does six: it also recomputes o = p v). Working on
s^T keeps four of them in A @ B or A @ B^T form and lets lse and delta enter as lane-major rows;
dq contracts dS^T over its key axis. dk and dv accumulate in f32 loop carries and are written
once per key tile; dk and dq take the softmax scale once at the end. Only the chunks that run
past the end of the sequence pay for the element-wise mask (lax.cond).

f32 inputs ask every matmul for full f32 precision: p = exp(s - lse) compares recomputed logits
with a given lse, so bf16-rounded logits would be off by up to |s| * 2**-8 in the exponent.

Blocks: BLOCK_K = 1024 (four kv blocks per head at seq 4096; the per-step cost is small next to
the work), TILE_K = BLOCK_Q = 512 ([512, 512] f32 logit tiles). The whole-head blocks need
about 8 * seq * head_dim * itemsize bytes (double-buffered) plus the f32 dq scratch, so
vmem_limit_bytes is raised to fit (seq 4096 f32: about 30 MiB in all).

Nothing is padded in HBM: blocks may overhang the arrays (the pipeline copies the rows that
exist and drops overhanging output rows on write-back). Rows past the sequence hold stale VMEM,
so the chunk and the tiles that run past its end (a ragged last tile, and whole tiles of a last
kv block that overhangs the sequence: 2560 keys in three blocks of 1024) zero those rows of q,
do, lse, delta, k and v and mask those queries and keys out of p; every term they could touch
is then exactly zero.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Finite, so a masked logit gives exp(_MASK_VALUE - lse) == 0.
_MASK_VALUE = -1e30
BLOCK_K = 1024  # keys (and dk/dv rows) per grid step, at most
TILE_K = 512    # keys per inner-loop tile
BLOCK_Q = 512   # queries per inner-loop chunk
_CAUSAL = False
_MiB = 1 << 20
_NN = (((1,), (0,)), ((), ()))  # A @ B
_NT = (((1,), (1,)), ((), ()))  # A @ B^T
_TN = (((0,), (0,)), ((), ()))  # A^T @ B


def _round_up(x, m):
    return (x + m - 1) // m * m


def _dot(a, b, dims):
    """a @ b in the given form with f32 accumulation; full f32 precision for f32 operands."""
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _zero_rows_from(x, start, limit, axis):
    """x with the positions start + index >= limit along axis set to zero."""
    pos = start + lax.broadcasted_iota(jnp.int32, x.shape, axis)
    return jnp.where(pos < limit, x, 0)


def attention_bwd_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, do_ref,
                         dq_ref, dk_ref, dv_ref, delta_ref, dq_acc, *,
                         scale, seq_len, kv_rows, tile_k, block_q):
    block_k, head_dim = k_ref.shape
    q_rows = q_ref.shape[0]
    n_chunks = q_rows // block_q
    kb = pl.program_id(2)
    ragged_q = seq_len % block_q != 0   # static: the last query chunk runs past the sequence
    # static: some key tile runs past the sequence (a ragged last tile, or whole tiles of the
    # last kv block beyond it when the blocks overhang the sequence)
    ragged_k = kv_rows > seq_len

    @pl.when(kb == 0)
    def _head_start():
        dq_acc[...] = jnp.zeros_like(dq_acc)
        ones = jnp.ones((8, head_dim), jnp.float32)

        def delta_chunk(i, _):
            rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
            od = o_ref[rows, :].astype(jnp.float32) * do_ref[rows, :].astype(jnp.float32)
            # Row sums as a lane-major row: ones [8, d] @ od^T -> [8, block_q], row 0.
            delta_ref[:, rows] = _dot(ones, od, _NT)[:1, :]
            return 0

        lax.fori_loop(0, n_chunks, delta_chunk, 0)

    def key_tile(t, _):
        k_start = kb * block_k + t * tile_k
        k_rows = pl.ds(pl.multiple_of(t * tile_k, tile_k), tile_k)
        k = k_ref[k_rows, :]  # [tile_k, d]
        v = v_ref[k_rows, :]
        if ragged_k:
            k, v = lax.cond(k_start + tile_k > seq_len,
                            lambda k, v: (_zero_rows_from(k, k_start, seq_len, 0),
                                          _zero_rows_from(v, k_start, seq_len, 0)),
                            lambda k, v: (k, v), k, v)

        def q_chunk(i, carry):
            dk_prev, dv_prev = carry
            q_start = i * block_q
            q_rows_i = pl.ds(pl.multiple_of(q_start, block_q), block_q)
            q = q_ref[q_rows_i, :]      # [block_q, d]
            do = do_ref[q_rows_i, :]
            lse = lse_ref[:, q_rows_i]  # [1, block_q]
            delta = delta_ref[:, q_rows_i]
            if ragged_q:
                q, do, lse, delta = lax.cond(
                    q_start + block_q > seq_len,
                    lambda *xs: tuple(_zero_rows_from(x, q_start, seq_len, a)
                                      for x, a in zip(xs, (0, 0, 1, 1))),
                    lambda *xs: xs, q, do, lse, delta)
            s_t = _dot(k, q, _NT) * scale  # [tile_k, block_q]

            def mask(s_t):
                key = k_start + lax.broadcasted_iota(jnp.int32, s_t.shape, 0)
                query = q_start + lax.broadcasted_iota(jnp.int32, s_t.shape, 1)
                visible = (key < seq_len) & (query < seq_len)
                if _CAUSAL:
                    visible &= key <= query
                return jnp.where(visible, s_t, _MASK_VALUE)

            needs_mask = (k_start + tile_k > seq_len) | (q_start + block_q > seq_len)
            if _CAUSAL:  # some key of the tile comes after some query of the chunk
                needs_mask |= k_start + tile_k - 1 > q_start
            s_t = lax.cond(needs_mask, mask, lambda s_t: s_t, s_t)
            p_t = jnp.exp(s_t - lse)                 # [tile_k, block_q]
            dv_new = dv_prev + _dot(p_t.astype(do.dtype), do, _NN)
            dp_t = _dot(v, do, _NT)                  # [tile_k, block_q]
            ds_t = (p_t * (dp_t - delta)).astype(q.dtype)
            dk_new = dk_prev + _dot(ds_t, q, _NN)
            dq_acc[q_rows_i, :] += _dot(ds_t, k, _TN)  # [block_q, d]
            return dk_new, dv_new

        # Causal: the first chunk with a query at or after the tile's first key.
        first = lax.div(k_start, block_q) if _CAUSAL else 0
        zeros = jnp.zeros((tile_k, head_dim), jnp.float32)
        dk, dv = lax.fori_loop(first, n_chunks, q_chunk, (zeros, zeros))
        dk_ref[k_rows, :] = (dk * scale).astype(dk_ref.dtype)
        dv_ref[k_rows, :] = dv.astype(dv_ref.dtype)
        return 0

    lax.fori_loop(0, block_k // tile_k, key_tile, 0)

    @pl.when(kb == pl.num_programs(2) - 1)
    def _head_end():
        dq_ref[...] = (dq_acc[...] * scale).astype(dq_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_k", "k_blocks", "tile_k", "block_q"))
def _attention_bwd(q, k, v, o, lse, do, *, block_k, k_blocks, tile_k, block_q):
    batch, heads, seq, head_dim = q.shape
    q_rows = _round_up(seq, block_q)  # the query-side blocks: whole chunks, overhanging
    lse_row = lse.astype(jnp.float32).reshape(batch, heads, 1, seq)  # lane-major rows
    sq = pl.squeezed
    head = pl.BlockSpec((sq, sq, q_rows, head_dim), lambda b, h, j: (b, h, 0, 0))
    head_row = pl.BlockSpec((sq, sq, 1, q_rows), lambda b, h, j: (b, h, 0, 0))
    kv_blk = pl.BlockSpec((sq, sq, block_k, head_dim), lambda b, h, j: (b, h, j, 0))
    itemsize = q.dtype.itemsize
    vmem = (2 * (4 * q_rows + 4 * block_k) * head_dim * itemsize  # double-buffered blocks
            + 4 * q_rows * (head_dim + 8)                        # dq and delta scratch
            + 10 * tile_k * block_q * 4 + 8 * _MiB)              # logit tiles and headroom
    kernel_fn = functools.partial(attention_bwd_kernel, scale=head_dim ** -0.5, seq_len=seq,
                                  kv_rows=k_blocks * block_k, tile_k=tile_k, block_q=block_q)
    dq, dk, dv = pl.pallas_call(
        kernel_fn,
        grid=(batch, heads, k_blocks),
        in_specs=[head, kv_blk, kv_blk, head, head_row, head],
        out_specs=[head, kv_blk, kv_blk],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        scratch_shapes=[pltpu.VMEM((1, q_rows), jnp.float32),          # delta row
                        pltpu.VMEM((q_rows, head_dim), jnp.float32)],  # dq accumulator
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=int(min(vmem, 100 * _MiB))),
    )(q, k, v, o, lse_row, do)
    return dq, dk, dv


def kernel(q, k, v, o, lse, do):
    if q.ndim != 4 or any(x.shape != q.shape for x in (k, v, o, do)) or lse.shape != q.shape[:3]:
        raise ValueError(f"expected q, k, v, o, do of one shape [batch, heads, seq, head_dim] and "
                         f"lse [batch, heads, seq], got {q.shape=} {k.shape=} {v.shape=} "
                         f"{o.shape=} {lse.shape=} {do.shape=}")
    seq = _round_up(q.shape[2], 128)
    block_q = min(BLOCK_Q, seq)
    tile_k = min(TILE_K, seq)
    # kv blocks of whole tiles, as equal as possible, each at most BLOCK_K rows.
    tiles = pl.cdiv(q.shape[2], tile_k)
    k_blocks = pl.cdiv(tiles, max(1, BLOCK_K // tile_k))
    block_k = pl.cdiv(tiles, k_blocks) * tile_k
    return _attention_bwd(q, k, v, o, lse, do, block_k=block_k, k_blocks=k_blocks,
                          tile_k=tile_k, block_q=block_q)
