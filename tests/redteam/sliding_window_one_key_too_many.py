"""Window off by one: a sliding-window flash-attention kernel (whole head resident, query
tiles looping over the key chunks their window reaches, the online softmax in the loop carry)
that keeps keys j >= i - W, W + 1 keys per query, where the task (Mistral's and Gemma-2's
sliding window) keeps i - W < j <= i, W keys counting the query's own. The chunk range and the
edge test follow the same wrong bound, so nothing is out of range and every row stays finite:
only rows at least W past the start see the one extra, oldest key, whose weight is large
wherever its logit is among the row's largest.
task: sliding_window_attention  expect: wrong_output"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_MASK_VALUE = -1e30  # finite: exp(_MASK_VALUE - m) is 0, never exp(-inf + inf) = NaN
BLOCK_Q = 4096  # query rows per grid step (at most)
TILE_Q = 512    # tune: 128, 256, 512  (query rows per inner tile)
BLOCK_K = 512   # tune: 128, 256, 512, 1024  (keys per inner chunk)
_MiB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def window_kernel(q_ref, k_ref, v_ref, o_ref, *, scale, seq_len, window, tile_q, block_k):
    block_q, head_dim = q_ref.shape
    n_chunks = k_ref.shape[0] // block_k

    def q_tile(t, _):
        rows = pl.ds(pl.multiple_of(t * tile_q, tile_q), tile_q)
        q = q_ref[rows, :]
        q0 = pl.program_id(2) * block_q + t * tile_q       # first query of the tile
        q1 = q0 + tile_q - 1                                # last query of the tile
        lo = lax.div(jnp.maximum(q0 - window, 0), block_k)
        hi = jnp.minimum(lax.div(q1, block_k) + 1, n_chunks)

        def chunk(c, carry):
            m_prev, l_prev, acc_prev = carry
            start = pl.multiple_of(c * block_k, block_k)
            k = k_ref[pl.ds(start, block_k), :]
            v = v_ref[pl.ds(start, block_k), :]
            if seq_len % block_k:  # static: the last chunk overhangs the sequence
                def zero_tail(v):
                    row = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
                    return jnp.where(row < seq_len, v, jnp.zeros_like(v))
                v = lax.cond(c == n_chunks - 1, zero_tail, lambda v: v, v)
            s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale

            def mask(s):
                query = q0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                key = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                return jnp.where((key <= query) & (key >= query - window), s, _MASK_VALUE)

            # The chunk crosses the diagonal (its last key after the tile's first query) or the
            # window's lower edge (its first key too old for the tile's last query).
            edge = (start + block_k - 1 > q0) | (start < q1 - window)
            s = lax.cond(edge, mask, lambda s: s, s)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.exp(s - m_new)
            l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
            acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v,
                                                 preferred_element_type=jnp.float32)
            return m_new, l_new, acc_new

        init = (jnp.full((tile_q, 1), -jnp.inf, jnp.float32), jnp.zeros((tile_q, 1), jnp.float32),
                jnp.zeros((tile_q, head_dim), jnp.float32))
        _, l, acc = lax.fori_loop(lo, hi, chunk, init)
        o_ref[rows, :] = (acc / l).astype(o_ref.dtype)
        return 0

    lax.fori_loop(0, block_q // tile_q, q_tile, 0)


@functools.partial(jax.jit, static_argnames=("window", "tile_q", "block_q", "q_blocks", "block_k"))
def _window_attention(q, k, v, *, window, tile_q, block_q, q_blocks, block_k):
    batch, heads, seq, head_dim = q.shape
    kv_rows = _round_up(seq, block_k)
    body = functools.partial(window_kernel, scale=head_dim ** -0.5, seq_len=seq, window=window,
                             tile_q=tile_q, block_k=block_k)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, block_q, head_dim),
                          lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, kv_rows, head_dim),
                           lambda b, h, i: (b, h, 0, 0))
    itemsize = q.dtype.itemsize
    vmem = (4 * (block_q + kv_rows) * head_dim * itemsize
            + 8 * tile_q * block_k * 4 + 4 * tile_q * head_dim * 4 + 8 * _MiB)
    return pl.pallas_call(
        body,
        grid=(batch, heads, q_blocks),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(max(vmem, 32 * _MiB), 100 * _MiB))),
    )(q, k, v)


def kernel(q, k, v, window):
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape or window.ndim != 1:
        raise ValueError(f"expected q, k, v [batch, heads, seq, head_dim] and window [W], got "
                         f"{q.shape=} {k.shape=} {v.shape=} {window.shape=}")
    seq = q.shape[2]
    tile_q = min(TILE_Q, _round_up(seq, 128))
    tiles = pl.cdiv(seq, tile_q)
    q_blocks = pl.cdiv(tiles, max(1, BLOCK_Q // tile_q))
    block_q = pl.cdiv(tiles, q_blocks) * tile_q
    block_k = min(BLOCK_K, _round_up(seq, 128))
    return _window_attention(q, k, v, window=int(window.shape[0]), tile_q=tile_q,
                             block_q=block_q, q_blocks=q_blocks, block_k=block_k)
