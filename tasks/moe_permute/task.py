"""moe_permute: MoE dispatch, every token's row copied once per chosen expert into expert order.

Tokens x[t, dm] and their top-k experts idx[t, k] (int32 in [0, e), distinct per token) give
t * k (token, slot) pairs. Sorted by expert, stably (pairs of one expert in token order, then
slot order, i.e. by their index token * k + slot), they give out[t * k, dm] whose row r is x's
row of the r-th pair's token, and counts[e] int32, how many pairs each expert got: exactly
what a grouped matmul consumes (grouped_matmul's lhs and group_sizes), expert by expert.
e is the length of `experts`, an int32 array holding 0..e-1 whose values carry nothing (as
moe_router_topk reads k from `slots`): kernels and references receive arrays only. Rows are
copied exactly, in x.dtype.

`expert_order` is the sort both this task and moe_unpermute (the combine that undoes it) use.

Shapes from the models' configs (hidden_size, routed experts, experts per token):
- Mixtral-8x7B: hidden 4096, num_local_experts 8, num_experts_per_tok 2 (train bench: 4096
  tokens; a train check case keeps its routing at a narrow width).
- Qwen1.5-MoE-A2.7B: hidden 2048, num_experts 60, num_experts_per_tok 4 (train bench, and its
  routing on a ragged train check case).
- DeepSeek-V2-Lite: hidden 2048, n_routed_experts 64, num_experts_per_tok 6 (held out; its
  routing also on a single token).
Shapes from: Mixtral-8x7B, Qwen1.5-MoE-A2.7B, DeepSeek-V2-Lite.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, Tolerance, case_grid, normal

_DTYPES = ("float32", "bfloat16")
# A permutation copies values: every element must be exact (zeros, constants and a wrong row
# all fail), and so must the counts.
EXACT = Tolerance(atol=0.0, rtol=0.0, rel_l2=0.0)


def expert_order(idx, num_experts):
    """(order, counts): order[r] is the flat index token * k + slot of the r-th (token, slot)
    pair sorted by expert, stably (ties by token, then slot); counts[x] the pairs of expert x."""
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    counts = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, counts


def reference(x, idx, experts):
    order, counts = expert_order(idx, experts.shape[0])
    return x[order // idx.shape[1]], counts


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    if not 1 <= d["k"] <= d["e"]:
        raise ValueError(f"{case.name}: k={d['k']} must be in [1, e={d['e']}]")
    return [ArgSpec((d["t"], d["dm"]), case.dtype), ArgSpec((d["t"], d["k"]), "int32"),
            ArgSpec((d["e"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["t"] * d["k"], d["dm"]), case.dtype), ArgSpec((d["e"],), "int32")]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Expert indices and the experts' ids are in [0, e)."""
    e = case.dims["e"]
    return [None, (0, e - 1), (0, e - 1)]


def draw_routing(case: Case, rng: np.random.Generator, skewed: bool = False) -> np.ndarray:
    """idx[t, k]: k distinct experts per token, in random slot order.

    default: uniform over the e experts, so every expert gets pairs from many tokens (ties in
      the sort everywhere).
    skewed: one hot expert in every token's top k (at a random slot), the other slots from a
      pool of k other experts, so one expert gets t pairs and e - k - 1 get none, as a router
      collapses before its load-balancing loss catches up.
    """
    t, k, e = case.dims["t"], case.dims["k"], case.dims["e"]
    if not skewed:
        return np.argsort(rng.random((t, e)), axis=1)[:, :k].astype(np.int32)
    experts = rng.permutation(e)
    hot, pool = experts[0], experts[1:1 + k]
    idx = np.empty((t, k), np.int64)
    for i in range(t):
        row = np.concatenate([[hot], rng.permutation(pool)[:k - 1]])
        idx[i] = rng.permutation(row)
    return idx.astype(np.int32)


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, _, _ = arg_specs(case)
    return (normal(rng, x_spec.shape, case.dtype), draw_routing(case, rng),
            np.arange(case.dims["e"], dtype=np.int32))


def skewed_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, _, _ = arg_specs(case)
    return (normal(rng, x_spec.shape, case.dtype), draw_routing(case, rng, skewed=True),
            np.arange(case.dims["e"], dtype=np.int32))


SKEWED = "one expert in every token's top k, most experts with no tokens"

CASES = (
    # Train: Mixtral's routing (8 experts, top 2) at a narrow width, and Qwen1.5-MoE's (60, top 4)
    # on a token count and width off the (8, 128) tile.
    case_grid("train", "check", [dict(t=256, dm=512, e=8, k=2), dict(t=150, dm=448, e=60, k=4)],
              _DTYPES)
    # Held-out: DeepSeek-V2-Lite's routing (64 experts, top 6) on an unaligned width, and a
    # single token.
    + case_grid("heldout", "check", [dict(t=90, dm=200, e=64, k=6), dict(t=1, dm=2048, e=64, k=6)],
                _DTYPES)
    + case_grid("train", "bench", [dict(t=4096, dm=4096, e=8, k=2), dict(t=4096, dm=2048, e=60, k=4)],
                _DTYPES)
    + case_grid("heldout", "bench", [dict(t=3000, dm=2048, e=64, k=6)], _DTYPES)
)

TASK = Task(
    name="moe_permute",
    version=1,
    level=2,
    description=("MoE dispatch: x's rows copied once per (token, slot) pair into expert order "
                 "(a stable sort by idx: ties by token, then slot), with the pairs per expert; e is "
                 "the length of experts."),
    signature=("kernel(x[t, dm], idx[t, k] int32, experts[e] int32) -> (out[t * k, dm], "
               "counts[e] int32)"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances={"float32": EXACT, "bfloat16": EXACT},
    required_features=("scalar_prefetch",),
    stresses=(Stress("skewed_routing", SKEWED, skewed_inputs),),
    # The reference's stable sort does O(n log n) comparisons, an honest counting sort O(n): the
    # solution's share of the reference's FLOPs falls from 79% at the held-out check sizes to 65%
    # at the held-out bench (n = t * k pairs), where the default 5% slack refused it.
    work_slack=0.25,
)
