"""paged_attention: one decode step of grouped-query attention over a paged KV cache.

Sequence b's token t lives in page page_indices[b, t // page_size], slot t % page_size, of
k_pages / v_pages [kv_heads, pages, page_size, head_dim]. Query head h (of hq) attends with kv
head h // (hq // hkv) to the keys at positions < lengths[b]; scale head_dim**-0.5, softmax in
float32, output in q.dtype.

The train bench's hq=32, hkv=8, d=128 are Llama-3-8B's and Mistral-7B's num_attention_heads,
num_key_value_heads and head_dim.
Shapes from: Llama-3-8B, Mistral-7B.
"""
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# q and k scaled so the logits have std ~2.25: the softmax is peaky and the output is O(0.1-1)
# rather than an average of many values of v washed out towards 0.
_QK_SCALE = 1.5


def reference(q, k_pages, v_pages, lengths, page_indices):
    out_dtype = q.dtype
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    pages_per_seq = page_indices.shape[1]
    seq = pages_per_seq * page_size

    def gather(pages):  # [hkv, pages, ps, d] -> [batch, hkv, seq, d] in token order
        x = pages.astype(jnp.float32)[:, page_indices]  # [hkv, batch, pages_per_seq, ps, d]
        return x.reshape(hkv, batch, seq, d).transpose(1, 0, 2, 3)

    k, v = gather(k_pages), gather(v_pages)
    qg = q.astype(jnp.float32).reshape(batch, hkv, hq // hkv, d)
    s = jnp.einsum("bhgd,bhtd->bhgt", qg, k, precision=lax.Precision.HIGHEST) * d ** -0.5
    live = jnp.arange(seq)[None, :] < lengths[:, None]  # [batch, seq]
    s = jnp.where(live[:, None, None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhgt,bhtd->bhgd", p, v, precision=lax.Precision.HIGHEST)
    return o.reshape(batch, hq, d).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    pages_shape = (d["hkv"], d["pages"], d["page_size"], d["d"])
    return [ArgSpec((d["b"], d["hq"], d["d"]), case.dtype),
            ArgSpec(pages_shape, case.dtype),
            ArgSpec(pages_shape, case.dtype),
            ArgSpec((d["b"],), "int32"),
            ArgSpec((d["b"], d["pages_per_seq"]), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def sequence_lengths(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Seeded lengths in [1, pages_per_seq * page_size], per the case's `lengths` kind.

    random: every length ends inside a page (never a multiple of page_size), so a kernel that
      rounds lengths to whole pages reads keys it must not.
    extremes: as random, but one sequence has length 1 and another the full length (needs b >= 2).
    """
    b, ps, pps = case.dims["b"], case.dims["page_size"], case.dims["pages_per_seq"]
    used_pages = rng.integers(1, pps + 1, size=b)
    lengths = (used_pages - 1) * ps + rng.integers(1, ps, size=b)
    kind = case.params["lengths"]
    if kind == "extremes":
        if b < 2:
            raise ValueError(f"{case.name}: extreme lengths need b >= 2")
        short, full = rng.choice(b, size=2, replace=False)
        lengths[short], lengths[full] = 1, pps * ps
    elif kind != "random":
        raise ValueError(f"{case.name}: unknown length distribution {kind!r}")
    return lengths.astype(np.int32)


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """lengths in [1, pages_per_seq * page_size]; page indices name one of the pages."""
    d = case.dims
    return [None, None, None, (1, d["pages_per_seq"] * d["page_size"]), (0, d["pages"] - 1)]


def fit_case(case: Case) -> Case:
    """A grader-derived case with a pool of pages large enough for every sequence's pages."""
    d = case.dims
    return dataclasses.replace(case, dims={**d, "pages": max(d["pages"], d["b"] * d["pages_per_seq"])})


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, _, _ = arg_specs(case)
    b, pps, pages = case.dims["b"], case.dims["pages_per_seq"], case.dims["pages"]
    if pages < b * pps:
        raise ValueError(f"{case.name}: {pages} pages cannot hold {b} x {pps} distinct pages")
    # A random permutation: no page shared between sequences, spare pages never referenced.
    page_indices = rng.permutation(pages)[: b * pps].reshape(b, pps).astype(np.int32)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            sequence_lengths(case, rng),
            page_indices)


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k_pages, v_pages, lengths, page_indices = make_inputs(case, rng)
    q, k_pages = logit_offset(q, k_pages, rng)
    return q.astype(np_dtype(case.dtype)), k_pages.astype(np_dtype(case.dtype)), v_pages, lengths, page_indices


def stale_cache_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A cache as a server leaves it: every page no sequence names, and every slot past a
    sequence's length, holds an earlier request's keys and values, 30 times larger than the
    live ones (their logits dwarf the live ones'); and lengths that end exactly on a page
    boundary (the task's own never do) or at 1. A kernel must keep those slots out before the
    softmax: a mask applied after exp (p * mask) meets exp of a huge logit, inf times 0."""
    q, k_pages, v_pages, lengths, page_indices = make_inputs(case, rng)
    b, ps = case.dims["b"], case.dims["page_size"]
    lengths = (np.maximum(lengths + ps - 1, ps) // ps * ps).astype(np.int32)  # whole pages
    lengths[int(rng.integers(b))] = 1
    live = np.zeros(k_pages.shape[1:3], bool)  # [pages, page_size]
    for seq in range(b):
        for t in range(int(lengths[seq])):
            live[page_indices[seq, t // ps], t % ps] = True
    stale = ~live[None, :, :, None]
    k_pages = np.where(stale, k_pages.astype(np.float32) * 30.0, k_pages.astype(np.float32))
    v_pages = np.where(stale, v_pages.astype(np.float32) * 30.0, v_pages.astype(np.float32))
    dt = np_dtype(case.dtype)
    return q, k_pages.astype(dt), v_pages.astype(dt), lengths, page_indices


CASES = (
    # GQA with 4 and 8 query heads per kv head, page_size 16, lengths ending mid-page.
    case_grid("train", "check",
              [dict(b=3, hq=8, hkv=2, d=128, page_size=16, pages_per_seq=8, pages=32),
               dict(b=2, hq=8, hkv=1, d=128, page_size=16, pages_per_seq=16, pages=40)],
              _DTYPES, params=dict(lengths="random"))
    # Held-out cases differ in kind: head_dim 64 and 256, other page sizes, plain multi-head
    # attention (one query head per kv head), batch 1, a length-1 and a full-length sequence.
    + case_grid("heldout", "check",
                [dict(b=4, hq=6, hkv=3, d=64, page_size=32, pages_per_seq=5, pages=24)],
                _DTYPES, params=dict(lengths="extremes"))
    + case_grid("heldout", "check",
                [dict(b=1, hq=4, hkv=4, d=256, page_size=64, pages_per_seq=6, pages=8)],
                _DTYPES, params=dict(lengths="random"))
    + case_grid("train", "bench",
                [dict(b=16, hq=32, hkv=8, d=128, page_size=16, pages_per_seq=256, pages=4096)],
                _DTYPES, params=dict(lengths="random"))
    + case_grid("heldout", "bench",
                [dict(b=5, hq=28, hkv=4, d=64, page_size=32, pages_per_seq=100, pages=520)],
                _DTYPES, params=dict(lengths="extremes"))
)

TASK = Task(
    name="paged_attention",
    version=1,
    level=3,
    description=("Paged-KV-cache decode attention (one query token per sequence, grouped-query "
                 "heads): keys/values gathered through a page table, positions >= lengths[b] "
                 "masked, scale head_dim**-0.5, softmax in float32; output in q.dtype."),
    signature=("kernel(q[b, hq, d], k_pages[hkv, pages, page_size, d], "
               "v_pages[hkv, pages, page_size, d], lengths[b] int32, "
               "page_indices[b, pages_per_seq] int32) -> [b, hq, d]"),
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
              Stress("stale_cache", "pages and slots past each length holding an earlier request's larger keys "
                     "and values, and lengths ending on page boundaries", stale_cache_inputs)),
)
