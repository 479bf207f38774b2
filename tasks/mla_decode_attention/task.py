"""mla_decode_attention: one decode step of DeepSeek's multi-head latent attention (MLA), absorbed.

MLA caches one latent vector per token, shared by every head: kv[b, s, c + 64] holds the
compressed KV (the first c = kv_lora_rank columns) and the decoupled rope key (the last 64 =
qk_rope_head_dim columns). In the absorbed form a decode kernel runs on (DeepSeek-V2's paper,
"absorb W_UK into W_Q"; FlashMLA), each query head's no-rope part has already been multiplied
by W_UK into the latent space and sits beside its rope part: q[b, h, c + 64]. Then for each of
b sequences (one new token each) and head h:
    scores = q[b, h] . kv[b, t]^T * 192**-0.5    for the positions t < lengths[b]
    out[b, h] = softmax(scores) . kv[b, :, :c]   (the compressed KV is also the value)
with the softmax in float32 and the output [b, h, c] in q.dtype; W_UV is applied after the
kernel. The scale is DeepSeek's softmax_scale, (qk_nope_head_dim + qk_rope_head_dim)**-0.5 =
(128 + 64)**-0.5, the head dim before absorption, not that of q here. 1 <= lengths[b] <= s;
positions >= lengths[b] hold whatever the cache held and must be masked out. The rope width is
64 in every case (all DeepSeek MLA models): kernels receive arrays only, so c = q.shape[-1] - 64.

Shapes from the models' configs (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
num_attention_heads):
- DeepSeek-V3 and DeepSeek-V2: kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
  128 heads; the train bench decodes 8 sequences against an 8192-token latent cache.
- DeepSeek-V2-Lite: the same latent widths with 16 heads; the held-out bench decodes 16
  sequences against a 5000-token cache (not a block multiple), with lengths of 1 and of the
  whole cache.
Check sizes scale kv_lora_rank down to 256 and 384 (train), 128 and 256 (held out) and keep
the rope width 64 (rows of q and kv are then off the 128-lane tile, as 576 is); heads: 8 and
12 in train, 20 and 2 held out.
Shapes from: DeepSeek-V3, DeepSeek-V2, DeepSeek-V2-Lite.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.references import HIGHEST, softmax_last_axis
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS

_DTYPES = ("float32", "bfloat16")
ROPE_DIM = 64  # qk_rope_head_dim of DeepSeek-V2, -V2-Lite and -V3
SOFTMAX_SCALE = (128 + ROPE_DIM) ** -0.5  # DeepSeek's (qk_nope_head_dim + qk_rope_head_dim)**-0.5
# Logits q . kv * SOFTMAX_SCALE with a standard deviation of ~2.25, as the other attention tasks:
# the softmax is peaky and the output is O(0.1-1), not an average of many values washed out.
_LOGIT_STD = 2.25
_BLOCK = 128  # the smallest lane-aligned kv block; drawn lengths straddle its multiples


def reference(q, kv, lengths):
    out_dtype = q.dtype
    c = q.shape[-1] - ROPE_DIM
    q, kv = q.astype(jnp.float32), kv.astype(jnp.float32)
    s = jnp.einsum("bhe,bte->bht", q, kv, precision=HIGHEST) * SOFTMAX_SCALE
    live = jnp.arange(kv.shape[1])[None, :] < lengths[:, None]  # [b, s]
    s = jnp.where(live[:, None, :], s, -jnp.inf)  # position 0 is always live: no NaN
    p = softmax_last_axis(s)
    o = jnp.einsum("bht,btc->bhc", p, kv[..., :c], precision=HIGHEST)
    return o.astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    width = d["c"] + ROPE_DIM
    return [ArgSpec((d["b"], d["h"], width), case.dtype), ArgSpec((d["b"], d["s"], width), case.dtype),
            ArgSpec((d["b"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["h"], d["c"]), case.dtype)]


def draw_lengths(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Seeded lengths in [1, s], from the case's `lengths` distribution, in random batch order.

    random: one length in (s/2, s) that is not a multiple of 128 (its last block partly empty),
      with b >= 2 one in [1, s/4] (most of the cache unused), the rest uniform in [1, s].
    extremes: one length 1 (a single key) and one length s (the cache full; needs b >= 2), with
      b >= 3 one in (s/2, s) off the 128 blocks, the rest uniform in [1, s].
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
    return [None, None, (1, case.dims["s"])]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, kv_spec, _ = arg_specs(case)
    width = q_spec.shape[-1]
    # kv ~ N(0, 1); q scaled so that q . kv * SOFTMAX_SCALE has std _LOGIT_STD at any width.
    q_scale = _LOGIT_STD / (SOFTMAX_SCALE * np.sqrt(width))
    return (normal(rng, q_spec.shape, case.dtype, scale=q_scale),
            normal(rng, kv_spec.shape, case.dtype),
            draw_lengths(case, rng))


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Every logit of a query carries an offset of 80 to 120 (models without QK-norm reach such
    logits): the first rope column of every cached key is 1 and that column of each query its
    offset / SOFTMAX_SCALE. The rope columns are keys only, so the values stay as drawn. Without
    its running max taken out, exp overflows float32."""
    q, kv, lengths = make_inputs(case, rng)
    c = case.dims["c"]
    q, kv = q.astype(np.float32), kv.astype(np.float32)
    q[..., c] = rng.uniform(80.0, 120.0, size=q.shape[:-1]) / SOFTMAX_SCALE
    kv[..., c] = 1.0
    return q.astype(np_dtype(case.dtype)), kv.astype(np_dtype(case.dtype)), lengths


def stale_cache_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A cache as a server leaves it: every position past a sequence's length holds an earlier
    request's latents, 30 times larger than the live ones (their logits dwarf the live ones',
    and as values they would swamp the output); and lengths that end exactly on a 128-block
    boundary (the task's own never do) or at 1. A kernel must keep those positions out before
    the softmax: a mask applied after exp (p * mask) meets exp of a huge logit, inf times 0."""
    q, kv, lengths = make_inputs(case, rng)
    b, s = case.dims["b"], case.dims["s"]
    lengths = np.minimum(np.maximum(lengths + _BLOCK - 1, _BLOCK) // _BLOCK * _BLOCK, s).astype(np.int32)
    lengths[int(rng.integers(b))] = 1
    stale = (np.arange(s)[None, :] >= lengths[:, None])[:, :, None]  # [b, s, 1]
    kv = np.where(stale, kv.astype(np.float32) * 30.0, kv.astype(np.float32))
    return q, kv.astype(np_dtype(case.dtype)), lengths


CASES = (
    # Train: 8 heads over a 256-wide latent cache of 2200 positions (several kv blocks), and 12
    # heads (off the 8-row tile) with a 384-wide latent over a short cache of 300. Neither
    # latent is 128 wide: there q is 192 wide and its own width**-0.5 would be the right scale.
    case_grid("train", "check", [dict(b=3, h=8, c=256, s=2200), dict(b=2, h=12, c=384, s=300)],
              _DTYPES, params=dict(lengths="random"))
    # Held-out: 20 heads with a 128-wide latent, lengths 1 and s; 2 heads for one sequence.
    + case_grid("heldout", "check", [dict(b=4, h=20, c=128, s=200)], _DTYPES,
                params=dict(lengths="extremes"))
    + case_grid("heldout", "check", [dict(b=1, h=2, c=256, s=1500)], _DTYPES,
                params=dict(lengths="random"))
    # DeepSeek-V3 / -V2 (128 heads, latent 512 + rope 64) decoding 8 sequences, 8192-token cache.
    + case_grid("train", "bench", [dict(b=8, h=128, c=512, s=8192)], _DTYPES,
                params=dict(lengths="random"))
    # DeepSeek-V2-Lite (16 heads) decoding 16 sequences against a 5000-token cache.
    + case_grid("heldout", "bench", [dict(b=16, h=16, c=512, s=5000)], _DTYPES,
                params=dict(lengths="extremes"))
)

TASK = Task(
    name="mla_decode_attention",
    version=1,
    level=2,
    description=("DeepSeek multi-head latent attention decode, absorbed form: every head's query "
                 "[latent c | rope 64] attends to one shared latent cache kv[b, s, c + 64], "
                 "positions >= lengths[b] masked, scale 192**-0.5, softmax in float32, values the "
                 "cache's first c columns; output in q.dtype."),
    signature="kernel(q[b, h, c + 64], kv[b, s, c + 64], lengths[b] int32) -> [b, h, c]",
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
              Stress("stale_cache", "positions past each length holding an earlier request's larger "
                     "latents, and lengths ending on 128-block boundaries", stale_cache_inputs)),
)
