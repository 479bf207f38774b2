"""gqa_decode_attention: one decode step of grouped-query attention over a contiguous KV cache.

Each of b sequences has one new query token with hq heads, q[b, hq, d], and a KV cache
k, v[b, hkv, s, d] of which the first lengths[b] positions are filled (1 <= lengths[b] <= s).
Query head h attends with kv head h // (hq // hkv) (consecutive query heads share a kv head) to
the positions < lengths[b]: softmax(q . k^T * d**-0.5) . v with the softmax in float32; output
in q.dtype. Positions >= lengths[b] hold whatever the cache held and must be masked out.

Shapes from the models' configs (num_attention_heads, num_key_value_heads, head_dim):
- Llama-3-8B: 32 query heads, 8 kv heads, head_dim 128; the train bench decodes 8 sequences
  against an 8192-token cache (its context length).
- Qwen2-7B: 28 query heads, 4 kv heads (7 per group), head_dim 128; the held-out bench, with
  a 5000-token cache (not a block multiple) and lengths of 1 and of the whole cache.
Check sizes keep those group shapes at a few heads: 4 and 6 query heads per kv head in train,
7 per kv head with head_dim 64 (as Qwen2-0.5B's 14 / 2) and plain multi-head attention (one
query head per kv head) held out.
Shapes from: Llama-3-8B, Qwen2-7B, Qwen2-0.5B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# q and k scaled so the logits have std ~2.25: the softmax is peaky and the output is O(0.1-1)
# rather than an average of many values of v washed out towards 0.
_QK_SCALE = 1.5
_BLOCK = 128  # the smallest lane-aligned kv block; drawn lengths straddle its multiples


def reference(q, k, v, lengths):
    out_dtype = q.dtype
    batch, hq, d = q.shape
    hkv, seq = k.shape[1], k.shape[2]
    qg = q.astype(jnp.float32).reshape(batch, hkv, hq // hkv, d)  # head h -> kv head h // group
    s = jnp.einsum("bhgd,bhtd->bhgt", qg, k.astype(jnp.float32),
                   precision=lax.Precision.HIGHEST) * d ** -0.5
    live = jnp.arange(seq)[None, :] < lengths[:, None]  # [batch, seq]
    s = jnp.where(live[:, None, None, :], s, -jnp.inf)  # position 0 is always live: no NaN
    s = s - jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s)
    p = e / jnp.sum(e, axis=-1, keepdims=True)
    o = jnp.einsum("bhgt,bhtd->bhgd", p, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return o.reshape(batch, hq, d).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    # A case gives g, the query heads per kv head, not hq = hkv * g: any hkv the grader derives
    # (growing one dimension, evaluator/analysis/coverage.py) is then a valid layout.
    d = case.dims
    cache = ArgSpec((d["b"], d["hkv"], d["s"], d["d"]), case.dtype)
    return [ArgSpec((d["b"], d["hkv"] * d["g"], d["d"]), case.dtype), cache, cache, ArgSpec((d["b"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def draw_lengths(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Seeded lengths in [1, s], from the case's `lengths` distribution, in random batch order.

    random: one length in (s/2, s) that is not a multiple of 128 (its last block is partly
      empty), with b >= 2 one in [1, s/4] (most of the cache unused), the rest uniform in [1, s].
    extremes: as random, but with one length 1 (a single key) and one length s (the cache
      full; needs b >= 2) in place of the short one.
    """
    b, s = case.dims["b"], case.dims["s"]
    kind = case.params["lengths"]
    if s < 8:
        raise ValueError(f"{case.name}: a cache of s={s} is too short for the length distributions")
    partial = int(rng.integers(s // 2 + 1, s))
    partial -= partial % _BLOCK == 0  # never a block multiple
    if kind == "random":
        lengths = [partial] + ([int(rng.integers(1, s // 4 + 1))] if b >= 2 else [])
    elif kind == "extremes":
        if b < 2:
            raise ValueError(f"{case.name}: extreme lengths need b >= 2")
        lengths = [1, s] + ([partial] if b >= 3 else [])
    else:
        raise ValueError(f"{case.name}: unknown length distribution {kind!r}")
    lengths += list(rng.integers(1, s + 1, size=b - len(lengths)))
    lengths = rng.permutation(np.array(lengths, np.int32))
    assert ((lengths >= 1) & (lengths <= s)).all()
    return lengths


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """lengths in [1, s]."""
    return [None, None, None, (1, case.dims["s"])]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, _ = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            draw_lengths(case, rng))


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v, lengths = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v, lengths


def stale_cache_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A cache as a server leaves it: every position past a sequence's length holds an earlier
    request's keys and values, 30 times larger than the live ones (their logits dwarf the live
    ones'); and lengths that end exactly on a 128-block boundary (the task's own never do) or
    at 1. A kernel must keep those positions out before the softmax: a mask applied after exp
    (p * mask) meets exp of a huge logit, inf times 0."""
    q, k, v, lengths = make_inputs(case, rng)
    b, s = case.dims["b"], case.dims["s"]
    lengths = np.minimum(np.maximum(lengths + _BLOCK - 1, _BLOCK) // _BLOCK * _BLOCK, s).astype(np.int32)
    lengths[int(rng.integers(b))] = 1
    stale = (np.arange(s)[None, :] >= lengths[:, None])[:, None, :, None]  # [b, 1, s, 1]
    k = np.where(stale, k.astype(np.float32) * 30.0, k.astype(np.float32))
    v = np.where(stale, v.astype(np.float32) * 30.0, v.astype(np.float32))
    return q, k.astype(np_dtype(case.dtype)), v.astype(np_dtype(case.dtype)), lengths


CASES = (
    # Train: 4 query heads per kv head over a cache of 2200 positions (several kv blocks), and
    # 6 per kv head (12 query heads: off the 8-row tile) over a short cache of 300.
    case_grid("train", "check", [dict(b=3, g=4, hkv=2, d=128, s=2200),
                                 dict(b=2, g=6, hkv=2, d=128, s=300)],
              _DTYPES, params=dict(lengths="random"))
    # Held-out: 7 query heads per kv head with head_dim 64, lengths 1 and s; plain multi-head
    # attention for one sequence.
    + case_grid("heldout", "check", [dict(b=4, g=7, hkv=2, d=64, s=200)], _DTYPES,
                params=dict(lengths="extremes"))
    + case_grid("heldout", "check", [dict(b=1, g=1, hkv=4, d=128, s=1500)], _DTYPES,
                params=dict(lengths="random"))
    # Llama-3-8B decoding 8 sequences against an 8192-token cache.
    + case_grid("train", "bench", [dict(b=8, g=4, hkv=8, d=128, s=8192)], _DTYPES,
                params=dict(lengths="random"))
    # Qwen2-7B decoding 6 sequences against a 5000-token cache.
    + case_grid("heldout", "bench", [dict(b=6, g=7, hkv=4, d=128, s=5000)], _DTYPES,
                params=dict(lengths="extremes"))
)

TASK = Task(
    name="gqa_decode_attention",
    version=1,
    level=3,
    description=("Grouped-query decode attention over a contiguous KV cache (one query token per "
                 "sequence): query head h uses kv head h // (hq // hkv), positions >= lengths[b] "
                 "masked, scale head_dim**-0.5, softmax in float32; output in q.dtype."),
    signature=("kernel(q[b, hq, d], k[b, hkv, s, d], v[b, hkv, s, d], lengths[b] int32) "
               "-> [b, hq, d]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    required_features=("scalar_prefetch",),
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),
              Stress("stale_cache", "positions past each length holding an earlier request's larger keys "
                     "and values, and lengths ending on 128-block boundaries", stale_cache_inputs)),
)
