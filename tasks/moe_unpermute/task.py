"""moe_unpermute: MoE combine, each token's k expert outputs gathered back and mixed by its
router weights.

y[t * k, dm] holds the experts' outputs in expert order, the order moe_permute dispatches in
(the (token, slot) pairs sorted stably by expert: `expert_order`, imported from that task);
idx[t, k] int32 are the same top-k experts (in [0, e), distinct per token) and w[t, k] float32
the router's weights. out[t, dm] = sum_j w[t, j] * y[pos(t, j)], where pos(t, j) is the row
that pair (t, j) was dispatched to (the inverse of the order), in float32; output in y.dtype.
e is the length of `experts`, an int32 array holding 0..e-1 whose values carry nothing: a
kernel that recomputes the order needs e as a shape, since kernels receive arrays only.

Shapes from the models' configs (hidden_size, routed experts, experts per token), as
moe_permute's:
- Mixtral-8x7B: hidden 4096, num_local_experts 8, num_experts_per_tok 2 (train bench).
- Qwen1.5-MoE-A2.7B: hidden 2048, num_experts 60, num_experts_per_tok 4 (train bench, and its
  routing on a ragged train check case).
- DeepSeek-V2-Lite: hidden 2048, n_routed_experts 64, num_experts_per_tok 6 (held out).
Shapes from: Mixtral-8x7B, Qwen1.5-MoE-A2.7B, DeepSeek-V2-Lite.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.moe_permute.task import CASES as PERMUTE_CASES, SKEWED, draw_routing, expert_order
from tasks.spec import DEFAULT_TOLERANCES, ArgSpec, Case, Stress, Task, normal

_DTYPES = ("float32", "bfloat16")


def reference(y, idx, w, experts):
    t, k = idx.shape
    order, _ = expert_order(idx, experts.shape[0])
    pos = jnp.zeros_like(order).at[order].set(jnp.arange(t * k, dtype=order.dtype))  # inverse
    rows = y.astype(jnp.float32)[pos].reshape(t, k, y.shape[1])
    return jnp.sum(w.astype(jnp.float32)[:, :, None] * rows, axis=1).astype(y.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    if not 1 <= d["k"] <= d["e"]:
        raise ValueError(f"{case.name}: k={d['k']} must be in [1, e={d['e']}]")
    return [ArgSpec((d["t"] * d["k"], d["dm"]), case.dtype), ArgSpec((d["t"], d["k"]), "int32"),
            ArgSpec((d["t"], d["k"]), "float32"), ArgSpec((d["e"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["t"], case.dims["dm"]), case.dtype)]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Expert indices and the experts' ids are in [0, e)."""
    e = case.dims["e"]
    return [None, (0, e - 1), None, (0, e - 1)]


def router_weights(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Renormalised top-k probabilities: a softmax over k logits of scale 2 (positive, summing
    to 1, the first expert's weight usually well above the others')."""
    logits = rng.standard_normal((case.dims["t"], case.dims["k"])) * 2.0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)).astype(np.float32)


def _inputs(case: Case, rng: np.random.Generator, skewed: bool) -> tuple[np.ndarray, ...]:
    y_spec = arg_specs(case)[0]
    return (normal(rng, y_spec.shape, case.dtype), draw_routing(case, rng, skewed=skewed),
            router_weights(case, rng), np.arange(case.dims["e"], dtype=np.int32))


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, skewed=False)


def skewed_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, skewed=True)


# The same routings as moe_permute, whose output this task combines.
CASES = PERMUTE_CASES


TASK = Task(
    name="moe_unpermute",
    version=1,
    level=2,
    description=("MoE combine: out[t] = sum_j w[t, j] * y[pos(t, j)], y in moe_permute's expert "
                 "order (a stable sort of the (token, slot) pairs by idx) and pos its inverse; "
                 "float32 accumulation, output in y.dtype; e is the length of experts."),
    signature=("kernel(y[t * k, dm], idx[t, k] int32, w[t, k] float32, experts[e] int32) "
               "-> [t, dm]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(DEFAULT_TOLERANCES),
    required_features=("scalar_prefetch",),
    stresses=(Stress("skewed_routing", SKEWED, skewed_inputs),),
)
