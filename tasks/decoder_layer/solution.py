"""One Llama decoder layer in four kernels: norm + QKV projection + RoPE, causal GQA flash
attention, output projection + residual, norm + SwiGLU MLP + residual.

1. `_qkv_rope`: grid (batch, row blocks, kv-head groups), the last "arbitrary". At a row
   block's first step the kernel normalises its rows once (float32 statistics over the whole
   width) into a VMEM scratch in the weights' dtype; each step then multiplies them by the wq,
   wk and wv columns of `kb` kv heads and their g * kb query heads (kb: the fewest kv heads
   whose columns fill whole 128-lane tiles; all of them where none do), applies RoPE to q and k
   in float32 (rotate-half as a lane roll by dh/2 and a sign) with the block's rows of the
   cos/sin tables, and stores each head into head-major q [b, hq, s, dh], k, v [b, hkv, s, dh]:
   the layout the attention kernel takes, so nothing is transposed in HBM.
2. `_attention`: grid (batch, kv heads, query blocks), all "parallel". A step holds the kv
   head's whole k and v ([s, dh], fetched once per head) and a block of up to BLOCK_Q rows of
   its g query heads. It loops over the g heads, their query tiles of TILE_Q rows and, for
   each tile, the key chunks of BLOCK_K up to the tile's diagonal only (the masked triangle is
   never computed), carrying the online softmax (running max, sum, f32 accumulator) in the
   loop; only chunks crossing the diagonal pay for the mask. Output o [b, hq, s, dh].
3. `_out_proj`: grid (batch, row blocks, column blocks of d). h = x + sum over heads of
   o[head] @ wo[head] (wo viewed as [hq, dh, d], a free reshape), f32 accumulation; a row
   block of o is fetched once and reused for every column block.
4. `_mlp`: grid (row blocks of the b * s rows, F blocks), F "arbitrary". At the first F step
   the rows of h are normalised into a VMEM scratch and the f32 accumulator (the output block
   itself for float32) starts at h; each F step adds (silu(hn @ wg) * (hn @ wu)) @ wd for its
   F block. The [rows, F] hidden activation never reaches HBM.

Sizes: weights stream once per row block, so row blocks are 512 rows (8 passes over the weights
at the Llama-3-8B bench, well under each kernel's compute time). Ragged sequences are never
padded in HBM: row blocks overhang the arrays (rows past the end hold stale VMEM, which only
produces rows that are dropped on write-back; every row-wise op keeps them to themselves), and
the attention's last key chunk zeroes the value rows past the sequence (p = 0 times a stale NaN
is still NaN; their keys are masked since they follow every query). An intermediate size that
is not a multiple of the F block is zero-padded (silu(0) * 0 = 0, and zero w_down rows add
nothing). Intermediates (q, k, v, o, h) are stored in x.dtype, as a model's layer stores them.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

EPS = 1e-5
# Finite, so a masked logit gives exp(_MASK_VALUE - m) == 0 and never exp(-inf - -inf) == NaN.
_MASK_VALUE = -1e30
_MiB = 1 << 20

QKV_ROWS = 512  # tune: 256, 512, 1024  (sequence rows per step of the norm + QKV + RoPE kernel)
BLOCK_Q = 4096  # tune: 1024, 2048, 4096  (query rows per attention grid step, at most)
TILE_Q = 512    # tune: 128, 256, 512  (query rows per inner tile)
BLOCK_K = 512   # tune: 128, 256, 512, 1024  (keys per inner chunk)
OUT_ROWS = 512  # tune: 256, 512, 1024  (rows per step of the output projection)
OUT_COLS = 512  # tune: 256, 512, 1024  (columns of d per step of the output projection)
MLP_ROWS = 512  # tune: 256, 512, 1024  (rows per step of the MLP)
MLP_F = 256     # tune: 128, 256, 512  (hidden units per MLP step)


def _round_up(x, m):
    return (x + m - 1) // m * m


def _vmem_limit(need):
    return int(min(100 * _MiB, max(32 * _MiB, need + need // 4 + 4 * _MiB)))


def _lanes(n):
    """VMEM holds a last dim in whole 128-lane tiles (head_dim 64 takes 128)."""
    return _round_up(n, 128)


def _rms_norm(y, g):
    """float32 rows y [rows, d] times g [1, d]."""
    return y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + EPS) * g


# --- 1. norm + QKV projection + RoPE ---------------------------------------------------------
def _rope(t, cos, sin):
    """t, cos, sin [rows, dh] float32: t * cos + concat(-t2, t1) * sin."""
    half = t.shape[-1] // 2
    rolled = pltpu.roll(t, half, 1)  # [t2, t1]: a roll by half the width, either way
    lane = lax.broadcasted_iota(jnp.int32, t.shape, 1)
    return t * cos + jnp.where(lane < half, -rolled, rolled) * sin


def qkv_rope_kernel(x_ref, cos_ref, sin_ref, g_ref, wq_ref, wk_ref, wv_ref, q_ref, k_ref, v_ref,
                    xn_ref):
    dh = q_ref.shape[-1]

    @pl.when(pl.program_id(2) == 0)
    def _normalise():
        x = x_ref[...].astype(jnp.float32)
        xn_ref[...] = _rms_norm(x, g_ref[...].astype(jnp.float32)).astype(xn_ref.dtype)

    xn = xn_ref[...]
    cos, sin = cos_ref[...], sin_ref[...]
    for w_ref, out_ref, rotate in ((wq_ref, q_ref, True), (wk_ref, k_ref, True), (wv_ref, v_ref, False)):
        t = jnp.dot(xn, w_ref[...], preferred_element_type=jnp.float32)  # [rows, heads * dh]
        for head in range(out_ref.shape[0]):
            th = t[:, head * dh:(head + 1) * dh]
            out_ref[head] = (_rope(th, cos, sin) if rotate else th).astype(out_ref.dtype)


def _kv_heads_per_step(hkv, dh):
    """The fewest kv heads whose columns fill whole 128-lane tiles, else all of them."""
    for kb in range(1, hkv + 1):
        if hkv % kb == 0 and (kb * dh) % 128 == 0:
            return kb
    return hkv


def _qkv_rope(x, cos, sin, g1, wq, wk, wv, *, bm, kb):
    b, s, d = x.shape
    dh = cos.shape[1]
    hq, hkv = wq.shape[1] // dh, wk.shape[1] // dh
    group = hq // hkv
    dt = x.dtype
    wi, xi = wq.dtype.itemsize, x.dtype.itemsize
    need = (2 * bm * d * xi + bm * d * wi + 4 * bm * d * 4      # x blocks, xn, f32 temporaries
            + 2 * d * (group + 2) * kb * dh * wi                   # weight blocks
            + 2 * (group + 2) * kb * bm * _lanes(dh) * xi           # q, k, v blocks
            + 4 * bm * _lanes(dh) * 4 + 4 * (group + 2) * kb * bm * dh * 4)  # tables, projections
    return pl.pallas_call(
        qkv_rope_kernel,
        grid=(b, pl.cdiv(s, bm), hkv // kb),
        in_specs=[
            pl.BlockSpec((None, bm, d), lambda bb, i, j: (bb, i, 0)),
            pl.BlockSpec((bm, dh), lambda bb, i, j: (i, 0)),
            pl.BlockSpec((bm, dh), lambda bb, i, j: (i, 0)),
            pl.BlockSpec((1, d), lambda bb, i, j: (0, 0)),
            pl.BlockSpec((d, group * kb * dh), lambda bb, i, j: (0, j)),
            pl.BlockSpec((d, kb * dh), lambda bb, i, j: (0, j)),
            pl.BlockSpec((d, kb * dh), lambda bb, i, j: (0, j)),
        ],
        out_specs=[pl.BlockSpec((None, group * kb, bm, dh), lambda bb, i, j: (bb, j, i, 0)),
                   pl.BlockSpec((None, kb, bm, dh), lambda bb, i, j: (bb, j, i, 0)),
                   pl.BlockSpec((None, kb, bm, dh), lambda bb, i, j: (bb, j, i, 0))],
        out_shape=[jax.ShapeDtypeStruct((b, hq, s, dh), dt),
                   jax.ShapeDtypeStruct((b, hkv, s, dh), dt),
                   jax.ShapeDtypeStruct((b, hkv, s, dh), dt)],
        scratch_shapes=[pltpu.VMEM((bm, d), wq.dtype)],  # the block's normalised rows
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(x, cos, sin, g1.reshape(1, d), wq, wk, wv)


# --- 2. causal GQA flash attention -----------------------------------------------------------
def attention_kernel(q_ref, k_ref, v_ref, o_ref, *, scale, seq_len, tile_q, block_k):
    group, block_q, dh = q_ref.shape
    n_kv_chunks = k_ref.shape[0] // block_k

    def head(hd, _):
        def q_tile(t, _):
            rows = pl.ds(pl.multiple_of(t * tile_q, tile_q), tile_q)
            q = q_ref[hd, rows, :]                                   # [tile_q, dh]
            q_start = pl.program_id(2) * block_q + t * tile_q
            # Chunks holding a key visible to the tile's last query (lax.div: operands >= 0).
            n_chunks = jnp.minimum(lax.div(q_start + tile_q - 1, block_k) + 1, n_kv_chunks)

            def chunk(c, carry):
                m_prev, l_prev, acc_prev = carry
                start = pl.multiple_of(c * block_k, block_k)
                k = k_ref[pl.ds(start, block_k), :]                  # [block_k, dh]
                v = v_ref[pl.ds(start, block_k), :]
                if seq_len % block_k:  # static: the last chunk runs past the sequence
                    def zero_tail(v):
                        pos = start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
                        return jnp.where(pos < seq_len, v, 0)
                    v = lax.cond(c == n_kv_chunks - 1, zero_tail, lambda v: v, v)
                s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32) * scale  # [tile_q, block_k]

                def mask(s):  # key j visible to query i iff j <= i
                    query = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                    key = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                    return jnp.where(key <= query, s, _MASK_VALUE)

                # The chunk's last key comes after the tile's first query: it crosses the diagonal.
                s = lax.cond(start + block_k - 1 > q_start, mask, lambda s: s, s)
                m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
                alpha = jnp.exp(m_prev - m_new)  # rescales what was summed under the old max
                p = jnp.exp(s - m_new)
                l_new = alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)
                acc_new = alpha * acc_prev + jnp.dot(p.astype(v.dtype), v,
                                                     preferred_element_type=jnp.float32)
                return m_new, l_new, acc_new

            init = (jnp.full((tile_q, 1), -jnp.inf, jnp.float32), jnp.zeros((tile_q, 1), jnp.float32),
                    jnp.zeros((tile_q, dh), jnp.float32))
            _, l, acc = lax.fori_loop(0, n_chunks, chunk, init)
            # Every query row saw key 0 (chunk 0 always runs), so l > 0.
            o_ref[hd, rows, :] = (acc / l).astype(o_ref.dtype)
            return 0

        lax.fori_loop(0, block_q // tile_q, q_tile, 0)
        return 0

    lax.fori_loop(0, group, head, 0)


def _q_blocking(rows):
    """(tile, block, blocks): tiles of TILE_Q rows (fewer for short inputs), grouped into
    `blocks` equal grid blocks of at most BLOCK_Q rows that cover the rows with the least
    overhang."""
    tile = min(TILE_Q, _round_up(rows, 128))
    tiles = pl.cdiv(rows, tile)
    blocks = pl.cdiv(tiles, max(1, BLOCK_Q // tile))
    return tile, pl.cdiv(tiles, blocks) * tile, blocks


def _attention(q, k, v):
    b, hq, s, dh = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    tile_q, block_q, q_blocks = _q_blocking(s)
    block_k = min(BLOCK_K, _round_up(s, 128))
    kv_rows = _round_up(s, block_k)  # the k/v block: whole chunks, overhanging the array
    kernel_fn = functools.partial(attention_kernel, scale=dh ** -0.5, seq_len=s, tile_q=tile_q,
                                  block_k=block_k)
    q_spec = pl.BlockSpec((None, group, block_q, dh), lambda bb, h, i: (bb, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, kv_rows, dh), lambda bb, h, i: (bb, h, 0, 0))
    itemsize = q.dtype.itemsize
    need = (4 * (group * block_q + kv_rows) * _lanes(dh) * itemsize  # q, o, k, v, double-buffered
            + 8 * tile_q * block_k * 4)                      # logits tiles
    return pl.pallas_call(
        kernel_fn,
        grid=(b, hkv, q_blocks),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(q, k, v)


# --- 3. output projection + residual ---------------------------------------------------------
def out_proj_kernel(o_ref, wo_ref, x_ref, h_ref):
    def head(hd, acc):
        return acc + jnp.dot(o_ref[hd], wo_ref[hd], preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, o_ref.shape[0], head, x_ref[...].astype(jnp.float32))
    h_ref[...] = acc.astype(h_ref.dtype)


def _out_proj(o, wo, x, *, bm, bn):
    b, hq, s, dh = o.shape
    d = x.shape[2]
    wo3 = wo.reshape(hq, dh, d)  # head-major rows of wo: free
    oi, wi, xi = o.dtype.itemsize, wo.dtype.itemsize, x.dtype.itemsize
    need = 2 * hq * bm * _lanes(dh) * oi + 2 * hq * dh * bn * wi + 4 * bm * bn * xi + 4 * bm * bn * 4
    return pl.pallas_call(
        out_proj_kernel,
        grid=(b, pl.cdiv(s, bm), pl.cdiv(d, bn)),
        in_specs=[pl.BlockSpec((None, hq, bm, dh), lambda bb, i, j: (bb, 0, i, 0)),
                  pl.BlockSpec((hq, dh, bn), lambda bb, i, j: (0, 0, j)),
                  pl.BlockSpec((None, bm, bn), lambda bb, i, j: (bb, i, j))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda bb, i, j: (bb, i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(o, wo3, x)


# --- 4. norm + SwiGLU MLP + residual -----------------------------------------------------------
def mlp_kernel(h_ref, g_ref, wg_ref, wu_ref, wd_ref, o_ref, hn_ref, *scratch):
    acc_ref = scratch[0] if scratch else o_ref  # float32 output: accumulate in place
    f = pl.program_id(1)

    @pl.when(f == 0)
    def _normalise():
        h = h_ref[...].astype(jnp.float32)
        hn_ref[...] = _rms_norm(h, g_ref[...].astype(jnp.float32)).astype(hn_ref.dtype)
        acc_ref[...] = h                                                   # the residual

    hn = hn_ref[...]
    gate = jnp.dot(hn, wg_ref[...], preferred_element_type=jnp.float32)   # [rows, bf]
    up = jnp.dot(hn, wu_ref[...], preferred_element_type=jnp.float32)
    act = gate * jax.nn.sigmoid(gate) * up
    acc_ref[...] += jnp.dot(act.astype(wd_ref.dtype), wd_ref[...], preferred_element_type=jnp.float32)

    if scratch:
        @pl.when(f == pl.num_programs(1) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _mlp(h, g2, w_gate, w_up, w_down, *, bm, bf):
    m, d = h.shape
    f = w_gate.shape[1]
    fp = _round_up(f, bf)
    if fp != f:  # zero hidden units: silu(0) * 0 = 0 against zero rows of w_down
        w_gate, w_up = (jnp.pad(w, ((0, 0), (0, fp - f))) for w in (w_gate, w_up))
        w_down = jnp.pad(w_down, ((0, fp - f), (0, 0)))
    separate_acc = h.dtype != jnp.float32
    hi, wi = h.dtype.itemsize, w_gate.dtype.itemsize
    need = (4 * bm * d * hi + bm * d * wi + (bm * d * 4 if separate_acc else 0)  # h, out, hn, acc
            + 2 * 3 * d * bf * wi + 3 * bm * d * 4 + 4 * bm * bf * 4)          # weights, temporaries
    return pl.pallas_call(
        mlp_kernel,
        grid=(pl.cdiv(m, bm), fp // bf),
        in_specs=[pl.BlockSpec((bm, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, d), lambda i, j: (0, 0)),
                  pl.BlockSpec((d, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((d, bf), lambda i, j: (0, j)),
                  pl.BlockSpec((bf, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((bm, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, d), h.dtype),
        scratch_shapes=[pltpu.VMEM((bm, d), w_gate.dtype)]                   # normalised rows
        + ([pltpu.VMEM((bm, d), jnp.float32)] if separate_acc else []),       # h + MLP so far
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(h, g2.reshape(1, d), w_gate, w_up, w_down)


# --- the layer -------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("sizes",))
def _layer(x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down, *, sizes):
    qkv_rows, kb, out_rows, out_cols, mlp_rows, mlp_f = sizes
    b, s, d = x.shape
    q, k, v = _qkv_rope(x, cos, sin, g1, wq, wk, wv, bm=qkv_rows, kb=kb)
    o = _attention(q, k, v)
    h = _out_proj(o, wo, x, bm=out_rows, bn=out_cols)
    out = _mlp(h.reshape(b * s, d), g2, w_gate, w_up, w_down, bm=mlp_rows, bf=mlp_f)
    return out.reshape(b, s, d)


def kernel(x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down):
    b, s, d = x.shape
    dh = cos.shape[1]
    hq, hkv, f = wq.shape[1] // dh, wk.shape[1] // dh, w_gate.shape[1]
    if (cos.shape != (s, dh) or sin.shape != (s, dh) or dh % 2 or hq * dh != wq.shape[1]
            or hkv * dh != wk.shape[1] or hq % hkv or wv.shape != wk.shape or wo.shape != (hq * dh, d)
            or w_up.shape != (d, f) or w_down.shape != (f, d)):
        raise ValueError(f"shape mismatch: {x.shape=} {cos.shape=} {wq.shape=} {wk.shape=} "
                         f"{wv.shape=} {wo.shape=} {w_gate.shape=} {w_up.shape=} {w_down.shape=}")
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    rows = lambda block, n: min(block, _round_up(n, sublane))
    cols = OUT_COLS if d % 128 == 0 and d > OUT_COLS else d
    sizes = (rows(QKV_ROWS, s), _kv_heads_per_step(hkv, dh), rows(OUT_ROWS, s), cols,
             rows(MLP_ROWS, b * s), min(MLP_F, _round_up(f, 128)))
    return _layer(x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down, sizes=sizes)
