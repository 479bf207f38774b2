"""ragged_paged_attention: one serving step's attention, prefill chunks and decodes mixed, over a
paged KV cache, as vLLM's TPU backend runs it ("ragged paged attention").

The query tokens of n sequences are packed along one token axis, q[t, hq, d]: sequence s owns
tokens cu_q_lens[s] .. cu_q_lens[s + 1] - 1 (q_len of them: one for a decode, many for a
prefill chunk; cu_q_lens[0] = 0, cu_q_lens[n] = t). Its keys and values, kv_lens[s] of them
(the new tokens' included: q_len <= kv_len), live in the pages page_indices[s, :] of
k_pages / v_pages [pages, page_size, hkv, d]: position p in page page_indices[s, p // page_size],
slot p % page_size. The query tokens are the sequence's last q_len positions, so token
cu_q_lens[s] + i sits at position kv_lens[s] - q_len + i and attends, causally, to positions
0 .. that one. Query head h uses kv head h // (hq // hkv); scale head_dim**-0.5, softmax in
float32, output [t, hq, d] in q.dtype.

The cache layout is that of jax's ragged_paged_attention kernel (v1, jax/experimental/pallas/
ops/tpu/ragged_paged_attention.py, behind torch_xla's ragged_paged_attention op: k_pages, v_pages
[total_num_pages, page_size, num_kv_heads, head_dim]); vLLM's TPU backend now keeps the same
layout with K and V heads interleaved in one array, [num_blocks, block_size, 2 * num_kv_heads,
head_size]. Sequences come in any order, decodes and prefills interleaved; their pages are
distinct, spread over the pool, and the slots past each kv_len (and the pages no sequence names)
hold stale values.

A case gives the mix as dims: `decode` sequences (q_len 1) and `prefill` sequences (q_len >= 2,
ragged, summing to t - decode) in random order; and g, query heads per kv head. kv_lens end
mid-page; a prefill chunk may be a prompt's first (kv_len = q_len) or continue one; one
sequence always reaches into its last page, so every page of the table is read somewhere.

Shapes from the models' configs (num_attention_heads, num_key_value_heads, head_dim) and vLLM's
TPU page sizes (PallasAttentionBackend.get_page_size: next_power_of_2(max_model_len) // 16,
clamped to [16, 256], and 16 for a max_model_len over 8192):
- Llama-3-8B: 32 query heads, 8 kv heads, head_dim 128. Train bench: a step of 1024 tokens, 60
  decodes and 4 prefill chunks, with page_size 128 (max_model_len 2048: 16 pages per sequence);
  and a step of 2048 tokens, 2 prefill chunks and 2 decodes, with page_size 16 over a 16384-token
  context (Llama-3.1-8B's long context, 1024 pages per sequence).
- Qwen2-7B: 28 query heads, 4 kv heads (7 per group), head_dim 128 (held out): 120 decodes and 3
  prefill chunks in 1000 tokens with page_size 64 (max_model_len 1024).
Check sizes keep 2 kv heads (groups of 4 and 6 query heads) at page_size 16; held out: page
sizes 32 and 64, head_dim 64, 7 query heads per kv head and plain multi-head attention,
decode-only and prefill-only steps.
Shapes from: Llama-3-8B, Qwen2-7B.
"""
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.references import HIGHEST, softmax_last_axis
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# q and k scaled so the logits have std ~2.25: the softmax is peaky and the output is O(0.1-1)
# rather than an average of many values of v washed out towards 0.
_QK_SCALE = 1.5
# The reference attends this many query tokens at once (a gather of their sequences' pages).
_REF_TOKENS = 8


def reference(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens):
    """Token by token (in groups): gather the token's sequence's pages, mask past its position."""
    out_dtype = q.dtype
    t, hq, d = q.shape
    _, page_size, hkv, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    seq_len = pages_per_seq * page_size
    token = jnp.arange(t)
    seq = jnp.sum(token[:, None] >= cu_q_lens[None, 1:], axis=1)    # the sequence of each token
    pos = kv_lens[seq] - (cu_q_lens[seq + 1] - token)                # its position in the sequence

    def attend(args):
        qt, s, p = args  # [hq, d], the token's sequence and position
        k = k_pages[page_indices[s]].reshape(seq_len, hkv, d).astype(jnp.float32)
        v = v_pages[page_indices[s]].reshape(seq_len, hkv, d).astype(jnp.float32)
        qg = qt.astype(jnp.float32).reshape(hkv, hq // hkv, d)      # head h -> kv head h // g
        logits = jnp.einsum("hgd,khd->hgk", qg, k, precision=HIGHEST) * d ** -0.5
        logits = jnp.where(jnp.arange(seq_len) <= p, logits, -jnp.inf)  # position 0 always: no NaN
        o = jnp.einsum("hgk,khd->hgd", softmax_last_axis(logits), v, precision=HIGHEST)
        return o.reshape(hq, d)

    out = jax.lax.map(attend, (q, seq, pos), batch_size=_REF_TOKENS)
    return out.astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    # A case gives g, the query heads per kv head (any hkv the grader derives is then a valid
    # layout), and the mix as `decode` and `prefill` sequence counts: n = decode + prefill.
    d = case.dims
    n = d["decode"] + d["prefill"]
    pages = ArgSpec((d["pages"], d["page_size"], d["hkv"], d["d"]), case.dtype)
    return [ArgSpec((d["t"], d["hkv"] * d["g"], d["d"]), case.dtype), pages, pages,
            ArgSpec((n,), "int32"), ArgSpec((n, d["pages_per_seq"]), "int32"), ArgSpec((n + 1,), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def _check_mix(case: Case) -> None:
    d = case.dims
    decode, prefill, t = d["decode"], d["prefill"], d["t"]
    seq_len = d["pages_per_seq"] * d["page_size"]
    fits = t == decode if prefill == 0 else t - decode >= 2 * prefill
    if decode < 0 or prefill < 0 or decode + prefill < 1 or not fits:
        raise ValueError(f"{case.name}: t={t} tokens cannot be {decode} decodes and {prefill} prefill chunks "
                         "of at least 2 tokens each")
    if t - decode > prefill * seq_len:
        raise ValueError(f"{case.name}: {t - decode} prefill tokens do not fit {prefill} sequences of "
                         f"{seq_len} positions")
    if d["pages"] < (decode + prefill) * d["pages_per_seq"]:
        raise ValueError(f"{case.name}: {d['pages']} pages cannot hold {decode + prefill} x "
                         f"{d['pages_per_seq']} distinct pages")


def fit_case(case: Case) -> Case:
    """A grader-derived case whose dims agree again: t holds every decode and at least two
    tokens per prefill chunk (exactly the decodes when there is none), the pages per sequence
    hold the longest possible chunk, and the pool holds every sequence's pages."""
    d = dict(case.dims)
    d["t"] = d["decode"] if d["prefill"] == 0 else max(d["t"], d["decode"] + 2 * d["prefill"])
    if d["prefill"]:
        longest = d["t"] - d["decode"] - 2 * (d["prefill"] - 1)
        d["pages_per_seq"] = max(d["pages_per_seq"], -(-longest // d["page_size"]))
    d["pages"] = max(d["pages"], (d["decode"] + d["prefill"]) * d["pages_per_seq"])
    return dataclasses.replace(case, dims=d)


def _prefill_lengths(total: int, count: int, cap: int, rng: np.random.Generator) -> list[int]:
    """`count` ragged chunk lengths, each in [2, cap], summing to `total` (<= count * cap)."""
    weights = rng.uniform(0.2, 1.0, size=count)
    spare = total - 2 * count
    lengths = 2 + np.floor(weights / weights.sum() * spare).astype(np.int64)
    for i in rng.choice(count, size=total - int(lengths.sum()), replace=True):
        lengths[i] += 1
    while lengths.max() > cap:  # move the overflow to chunks with room
        i, j = int(np.argmax(lengths)), int(np.argmin(lengths))
        move = min(lengths[i] - cap, cap - lengths[j])
        lengths[i] -= move
        lengths[j] += move
    assert lengths.sum() == total and lengths.min() >= 2
    return [int(x) for x in lengths]


def draw_step(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(kv_lens[n], cu_q_lens[n + 1]) of one serving step, sequences in random order.

    Decodes: kv_len in [1, seq_len]. Prefill chunks: q_len ragged in [2, seq_len], kv_len in
    [q_len + 1, seq_len] (a chunk that continues its prompt), except the first where there are
    two or more: a prompt's first chunk (kv_len = q_len). kv_lens end inside a page (not on its
    last slot) wherever they can, and one sequence's kv_len lies in its last page (so the
    longest sequence spans the whole table: every chunk loop runs to the end somewhere).
    """
    _check_mix(case)
    d = case.dims
    ps, seq_len = d["page_size"], d["pages_per_seq"] * d["page_size"]
    decode, prefill, t = d["decode"], d["prefill"], d["t"]
    chunks = _prefill_lengths(t - decode, prefill, seq_len, rng) if prefill else []
    q_lens = np.array([1] * decode + chunks, np.int64)
    n = len(q_lens)

    def mid_page(lo: int) -> int:
        """A length in [lo, seq_len] that ends before its page's last slot where one can."""
        value = int(rng.integers(lo, seq_len + 1))
        if value % ps == 0 and value - 1 >= lo:
            value -= 1
        return value

    # A decode's kv_len holds its token; a continued chunk has context before it.
    kv_lens = np.array([mid_page(int(q) if q == 1 else min(int(q) + 1, seq_len)) for q in q_lens], np.int64)
    fresh = decode if prefill >= 2 else -1
    if fresh >= 0:
        kv_lens[fresh] = q_lens[fresh]  # a prompt's first chunk: no context before it
    longest = int(rng.choice([i for i in range(n) if i != fresh]))
    kv_lens[longest] = max(int(q_lens[longest]), int(rng.integers(seq_len - ps + 1, seq_len + 1)))
    order = rng.permutation(n)
    q_lens, kv_lens = q_lens[order], kv_lens[order]
    assert (q_lens >= 1).all() and (q_lens <= kv_lens).all() and (kv_lens <= seq_len).all()
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    assert cu_q_lens[-1] == t
    return kv_lens.astype(np.int32), cu_q_lens


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """kv_lens in [1, pages_per_seq * page_size]; page indices name one of the pages;
    cu_q_lens in [0, t]."""
    d = case.dims
    return [None, None, None, (1, d["pages_per_seq"] * d["page_size"]), (0, d["pages"] - 1), (0, d["t"])]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, _, table_spec, _ = arg_specs(case)
    kv_lens, cu_q_lens = draw_step(case, rng)
    n, pages_per_seq = table_spec.shape
    # A random permutation: no page shared between sequences, spare pages never referenced.
    page_indices = rng.permutation(case.dims["pages"])[: n * pages_per_seq].reshape(n, pages_per_seq)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            kv_lens, page_indices.astype(np.int32), cu_q_lens)


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens = make_inputs(case, rng)
    q, k_pages = logit_offset(q, k_pages, rng)
    dt = np_dtype(case.dtype)
    return q.astype(dt), k_pages.astype(dt), v_pages, kv_lens, page_indices, cu_q_lens


def stale_cache_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A cache as a server leaves it: every page no sequence names, and every slot past a
    sequence's kv_len, holds an earlier request's keys and values, 30 times larger than the
    live ones (their logits dwarf the live ones'); and kv_lens that end exactly on a page
    boundary wherever the chunk allows (the task's own never do). A kernel must keep those
    slots out before the softmax: a mask applied after exp (p * mask) meets exp of a huge
    logit, inf times 0."""
    q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens = make_inputs(case, rng)
    ps = case.dims["page_size"]
    seq_len = page_indices.shape[1] * ps
    whole = np.minimum((kv_lens + ps - 1) // ps * ps, seq_len).astype(np.int32)  # never below q_len
    live = np.zeros(k_pages.shape[:2], bool)  # [pages, page_size]
    for s, length in enumerate(whole):
        for p in range(int(length)):
            live[page_indices[s, p // ps], p % ps] = True
    stale = ~live[:, :, None, None]
    dt = np_dtype(case.dtype)
    k_pages = np.where(stale, k_pages.astype(np.float32) * 30.0, k_pages.astype(np.float32)).astype(dt)
    v_pages = np.where(stale, v_pages.astype(np.float32) * 30.0, v_pages.astype(np.float32)).astype(dt)
    return q, k_pages, v_pages, whole, page_indices, cu_q_lens


def _cases(split: str, size: str, dims: dict, mixes: list[tuple[int, int, int]]) -> list[Case]:
    """case_grid over (decode, prefill, t) mixes with shared head and page dims."""
    return case_grid(split, size, [dict(decode=dc, prefill=pf, t=t, **dims) for dc, pf, t in mixes], _DTYPES)


CASES = (
    # Train: 4 query heads per kv head, page_size 16, 2 decodes and 2 prefill chunks in 40
    # tokens; 6 per kv head (12 query heads: off the 8-row tile) with 5 decodes and one chunk in
    # 45 tokens (off the tile too).
    _cases("train", "check", dict(g=4, hkv=2, d=128, page_size=16, pages_per_seq=8, pages=40), [(2, 2, 40)])
    + _cases("train", "check", dict(g=6, hkv=2, d=128, page_size=16, pages_per_seq=8, pages=56), [(5, 1, 45)])
    # Held-out: a decode-only step, 7 query heads per kv head, head_dim 64, page_size 32; a
    # prefill-only step (two chunks, one a fresh prompt) of plain multi-head attention with
    # page_size 64.
    + _cases("heldout", "check", dict(g=7, hkv=1, d=64, page_size=32, pages_per_seq=4, pages=28), [(6, 0, 6)])
    + _cases("heldout", "check", dict(g=1, hkv=4, d=128, page_size=64, pages_per_seq=2, pages=6), [(0, 2, 70)])
    # Llama-3-8B: a 1024-token step of 60 decodes and 4 prefill chunks at page_size 128 (2048
    # positions per sequence); a 2048-token step of 2 decodes and 2 chunks at page_size 16 over
    # 16384 positions.
    + _cases("train", "bench", dict(g=4, hkv=8, d=128, page_size=128, pages_per_seq=16, pages=1024),
             [(60, 4, 1024)])
    + _cases("train", "bench", dict(g=4, hkv=8, d=128, page_size=16, pages_per_seq=1024, pages=4096),
             [(2, 2, 2048)])
    # Qwen2-7B: 120 decodes and 3 prefill chunks in 1000 tokens at page_size 64 (1024 positions).
    + _cases("heldout", "bench", dict(g=7, hkv=4, d=128, page_size=64, pages_per_seq=16, pages=1968),
             [(120, 3, 1000)])
)

TASK = Task(
    name="ragged_paged_attention",
    version=1,
    level=3,
    description=("Mixed prefill and decode attention over a paged KV cache: the query tokens of n "
                 "sequences packed along one axis (cu_q_lens), each token attending causally to its "
                 "sequence's keys (kv_lens, page_indices) up to its own position, grouped-query heads, "
                 "scale head_dim**-0.5, softmax in float32; output in q.dtype."),
    signature=("kernel(q[t, hq, d], k_pages[pages, page_size, hkv, d], v_pages[pages, page_size, hkv, d], "
               "kv_lens[n] int32, page_indices[n, pages_per_seq] int32, cu_q_lens[n + 1] int32) "
               "-> [t, hq, d]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    required_features=("scalar_prefetch", "manual_dma"),
    fit_case=fit_case,
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),
              Stress("stale_cache", "pages and slots past each kv_len holding an earlier request's larger keys "
                     "and values, and kv_lens ending on page boundaries", stale_cache_inputs)),
)
