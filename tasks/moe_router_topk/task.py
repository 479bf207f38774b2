"""moe_router_topk: the router of a mixture-of-experts layer, top-k experts per token.

For each token (a row of logits[t, e], one logit per expert): the softmax over the e experts in
float32, the k experts with the largest logits (the softmax's order), and their probabilities
renormalised to sum to 1 over the k chosen (Mixtral's routing, and that of the DeepSeek and Qwen
MoE configs that set `norm_topk_prob`). Returns (weights[t, k] float32, indices[t, k] int32),
both in descending order of the logit; equal logits are taken lowest expert index first (as
lax.top_k).

k is the case's static `k` param. The kernel reads it from the shape of `slots`, an int32 array
holding 0..k-1 whose values carry nothing (as group_norm reads its group count from gamma's
shape): kernels and references receive arrays only.

Expert counts and k from the models' configs (only the router's shapes are taken from them):
- Mixtral-8x7B: num_local_experts 8, num_experts_per_tok 2; the train bench routes 32768 tokens
  (its 32K context in one prefill).
- DBRX: 16 experts, top 4 (a train check case).
- DeepSeek-V2-Lite: n_routed_experts 64, num_experts_per_tok 6 (held out).
- Qwen1.5-MoE-A2.7B: num_experts 60, num_experts_per_tok 4 (held out: 60 experts fill no
  sublane tile).
Shapes from: Mixtral-8x7B, DBRX, DeepSeek-V2-Lite, Qwen1.5-MoE-A2.7B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import DEFAULT_TOLERANCES, ArgSpec, Case, Stress, Task, Tolerance, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS

_DTYPES = ("float32", "bfloat16")
# Router logits of scale 2: the top experts' weights differ visibly (0.5-0.9 for the first of
# two), neither uniform nor one-hot.
_LOGIT_SCALE = 2.0
# Both outputs are float32 / int32 whatever the logits' dtype, computed in float32 from logits
# that are exact in it, so one bound serves both dtypes. The element bound (1e-3 of the rms plus
# 1e-3 of the value) is below 0.1 for any index under 100: every index must be exact. Weights
# of an honest kernel miss by float32 rounding (~1e-7); one whose softmax runs in bfloat16
# misses by ~4e-3 and fails.
ROUTER_TOLERANCE = Tolerance(atol=1e-3, rtol=1e-3, rel_l2=DEFAULT_TOLERANCES["float32"].rel_l2)


def reference(logits, slots):
    k = slots.shape[0]
    x = logits.astype(jnp.float32)
    top = jnp.max(x, axis=-1, keepdims=True)
    denominator = jnp.sum(jnp.exp(x - top), axis=-1, keepdims=True)  # the softmax over experts
    chosen, indices = lax.top_k(x, k)  # descending; equal logits: the lower expert index first
    weights = jnp.exp(chosen - top) / denominator                    # their probabilities
    return weights / jnp.sum(weights, axis=-1, keepdims=True), indices.astype(jnp.int32)


def arg_specs(case: Case) -> list[ArgSpec]:
    d, k = case.dims, case.params["k"]
    if not 1 <= k <= d["e"]:
        raise ValueError(f"{case.name}: k={k} must be in [1, e={d['e']}]")
    return [ArgSpec((d["t"], d["e"]), case.dtype), ArgSpec((k,), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    shape = (case.dims["t"], case.params["k"])
    return [ArgSpec(shape, "float32"), ArgSpec(shape, "int32")]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """slots holds 0..k-1."""
    return [None, (0, case.params["k"] - 1)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    logits_spec, _ = arg_specs(case)
    return (normal(rng, logits_spec.shape, case.dtype, scale=_LOGIT_SCALE),
            np.arange(case.params["k"], dtype=np.int32))


def tied_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Logits that are half-integers from -3 to 3 (exact in either dtype), as quantised or
    saturated router scores: a token's best experts share a logit often, and a tie across the
    k-th place decides which expert is routed at all. A kernel that takes the last of equal
    logits, or knocks out every copy of the maximum, routes other experts."""
    logits_spec, slots = arg_specs(case)
    values = rng.integers(-6, 7, size=logits_spec.shape) / 2.0
    return values.astype(np.float32).astype(np_dtype(case.dtype)), np.arange(slots.shape[0], dtype=np.int32)


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Every token's logits moved by 80 to 120 (softmax does not change with it; routers
    without a z-loss drift there): exp overflows float32 unless the token's maximum is taken
    out first. In bfloat16 the offset leaves half-integer steps, so ties occur too."""
    logits, slots = make_inputs(case, rng)
    offset = rng.uniform(80.0, 120.0, size=(logits.shape[0], 1))
    return (logits.astype(np.float32) + offset.astype(np.float32)).astype(logits.dtype), slots


CASES = (
    # Mixtral-8x7B's router, and DBRX's (16 experts, top 4) on a token count off the 8-row tile.
    case_grid("train", "check", [dict(t=2048, e=8)], _DTYPES, params=dict(k=2))
    + case_grid("train", "check", [dict(t=1100, e=16)], _DTYPES, params=dict(k=4))
    # Held-out: DeepSeek-V2-Lite (64 experts, top 6), and Qwen1.5-MoE (60, top 4) for one token.
    + case_grid("heldout", "check", [dict(t=700, e=64)], _DTYPES, params=dict(k=6))
    + case_grid("heldout", "check", [dict(t=1, e=60)], _DTYPES, params=dict(k=4))
    + case_grid("train", "bench", [dict(t=32768, e=8)], _DTYPES, params=dict(k=2))
    + case_grid("heldout", "bench", [dict(t=16384, e=64)], _DTYPES, params=dict(k=6))
    + case_grid("heldout", "bench", [dict(t=8192, e=60)], _DTYPES, params=dict(k=4))
)

TASK = Task(
    name="moe_router_topk",
    version=1,
    level=2,
    description=("MoE router: softmax over experts in float32, the top k experts per token (equal "
                 "logits: lowest index first) and their probabilities renormalised to sum to 1; "
                 "k is the length of slots."),
    signature=("kernel(logits[t, e], slots[k] int32) -> (weights[t, k] float32, "
               "indices[t, k] int32)"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances={"float32": ROUTER_TOLERANCE, "bfloat16": ROUTER_TOLERANCE},
    stresses=(Stress("ties", "logits that are half-integers, so a token's best experts tie", tied_inputs),
              Stress("large_logits", LARGE_LOGITS, large_logit_inputs)),
)
