"""moe_layer: a whole mixture-of-experts FFN layer, router to combine (Mixtral style).

Tokens x[t, d] are routed by w_router[d, e]: each token's router logits x @ w_router in
float32, its k experts with the largest logits (equal logits: lowest expert index first, as
lax.top_k), and their weights p, a softmax over those k logits alone (Mixtral's routing; DeepSeek
and Qwen MoE configs with `norm_topk_prob` give the same weights). Expert i is a SwiGLU FFN with
its own w_gate[i], w_up[i] of [d, f] and w_down[i] of [f, d]:
out[t] = sum_j p[t, j] * (silu(x[t] @ w_gate[i_j]) * (x[t] @ w_up[i_j])) @ w_down[i_j],
matmuls accumulated in float32, the hidden activation in x.dtype (as the model keeps it), the
combine in float32, the output in x.dtype. k is the length of `slots`, an int32 array holding
0..k-1 whose values carry nothing (as moe_router_topk reads it): kernels receive arrays only.

The router logits decide which experts run, so they are float32 products (the reference
multiplies at full precision): a single bf16 MXU pass over float32 x moves a logit by ~1e-2,
enough to send tokens whose k-th and (k+1)-th logits are that close to another expert, and a
token sent elsewhere is wrong by its whole output.

The reference routes as a kernel should: the (token, slot) pairs sorted by expert (stably),
each expert's rows through its FFN as grouped matmuls (lax.ragged_dot), the rows put back in
token order and mixed by p. So its FLOPs are the routed work, t * k rows through one expert
each plus the router, not a dense pass of every token through all e experts (which would be
e / k times more), and the task's necessary FLOPs are the reference's own
(necessary_flops_share stays 1): one share per task could not be k / e for every case anyway
(1/4 for Mixtral, 3/32 for DeepSeek-V2-Lite, 1/15 for Qwen1.5-MoE).

Shapes from the models' configs (hidden_size d, expert FFN width f, routed experts e, experts
per token k); t tokens:
- Mixtral-8x7B: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
  num_experts_per_tok 2; the train bench routes 8192 tokens (float32 weights are 5.6 GB of a
  v5e's 16 GiB; the reference's float32 activations, [16384, 14336] for gate, up and the hidden,
  another 2.8 GB); a train check case keeps its routing at narrow widths.
- DeepSeek-V2-Lite: hidden_size 2048, moe_intermediate_size 1408, n_routed_experts 64,
  num_experts_per_tok 6 (its 2 shared experts are a dense FFN beside this layer, not part of
  it); the train bench routes 16384 tokens, and its routing is on a ragged train check case.
- Qwen1.5-MoE-A2.7B: hidden_size 2048, moe_intermediate_size 1408, num_experts 60,
  num_experts_per_tok 4 (held out; its shared expert left out as DeepSeek's).
- Phi-3.5-MoE: hidden_size 4096, intermediate_size 6400, num_local_experts 16,
  num_experts_per_tok 2 (held out).
Shapes from: Mixtral-8x7B, DeepSeek-V2-Lite, Qwen1.5-MoE-A2.7B, Phi-3.5-MoE.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import (
    GATED_MXU_TOLERANCES,
    ArgSpec,
    Case,
    Stress,
    Task,
    case_grid,
    normal,
)

_DTYPES = ("float32", "bfloat16")
# Router logits of scale 2 (as moe_router_topk's): the chosen experts' weights differ visibly.
_LOGIT_SCALE = 2.0


def reference(x, slots, w_router, w_gate, w_up, w_down):
    t, d = x.shape
    k, e = slots.shape[0], w_router.shape[1]
    logits = jnp.dot(x.astype(jnp.float32), w_router.astype(jnp.float32),
                     precision=lax.Precision.HIGHEST)
    chosen, idx = lax.top_k(logits, k)                        # [t, k], equal logits: lower index
    p = jax.nn.softmax(chosen, axis=-1)                       # over the k chosen logits only
    flat = idx.reshape(-1)                                    # pair r = token * k + slot
    order = jnp.argsort(flat, stable=True)                    # pairs in expert order
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    rows = x[order // k]
    gate = lax.ragged_dot(rows, w_gate, sizes, preferred_element_type=jnp.float32)
    up = lax.ragged_dot(rows, w_up, sizes, preferred_element_type=jnp.float32)
    h = (jax.nn.silu(gate) * up).astype(x.dtype)
    y = lax.ragged_dot(h, w_down, sizes, preferred_element_type=jnp.float32)   # expert order
    pos = jnp.zeros_like(order).at[order].set(jnp.arange(t * k, dtype=order.dtype))
    y = y[pos].reshape(t, k, d)                               # back in token order
    return jnp.sum(p[:, :, None] * y, axis=1).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d, k = case.dims, case.params["k"]
    if not 1 <= k <= d["e"]:
        raise ValueError(f"{case.name}: k={k} must be in [1, e={d['e']}]")
    return [ArgSpec((d["t"], d["d"]), case.dtype), ArgSpec((k,), "int32"),
            ArgSpec((d["d"], d["e"]), case.dtype),
            ArgSpec((d["e"], d["d"], d["f"]), case.dtype), ArgSpec((d["e"], d["d"], d["f"]), case.dtype),
            ArgSpec((d["e"], d["f"], d["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["t"], case.dims["d"]), case.dtype)]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """slots holds 0..k-1."""
    return [None, (0, case.params["k"] - 1), None, None, None, None]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, _, r_spec, g_spec, u_spec, dn_spec = arg_specs(case)
    d, f = case.dims["d"], case.dims["f"]
    # Router logits of std ~2; gate and up scaled by 1/sqrt(d) are O(1) (silu in its curved
    # region); w_down by 1/sqrt(f) keeps each expert's output O(0.5).
    return (normal(rng, x_spec.shape, case.dtype),
            np.arange(case.params["k"], dtype=np.int32),
            normal(rng, r_spec.shape, case.dtype, scale=_LOGIT_SCALE * d ** -0.5),
            normal(rng, g_spec.shape, case.dtype, scale=d ** -0.5),
            normal(rng, u_spec.shape, case.dtype, scale=d ** -0.5),
            normal(rng, dn_spec.shape, case.dtype, scale=f ** -0.5))


def skewed_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A router that has collapsed: one channel of x holds a massive activation (8 in every
    token, as LLM hidden states have a few such channels), and the router reads it strongly for
    one hot expert, less for a pool of k others, and against every other expert. Nearly every
    token routes to the hot expert and k - 1 of the pool (picked by its other channels), so one
    group holds nearly all t tokens, k others share the rest of the rows, and the other experts
    get none; the chosen logits still differ by O(1) from token to token, so no expert's weight
    is negligible."""
    x, slots, w_router, w_gate, w_up, w_down = make_inputs(case, rng)
    e, k = case.dims["e"], case.params["k"]
    channel = int(rng.integers(case.dims["d"]))
    experts = rng.permutation(e)
    hot, pool = experts[0], experts[1:1 + k]
    x = x.astype(np.float32)
    x[:, channel] = 8.0
    row = np.full(e, -1.0, np.float32)
    row[pool] = 0.9
    row[hot] = 1.2
    w_router = w_router.astype(np.float32)
    w_router[channel] = row
    return (x.astype(w_gate.dtype), slots, w_router.astype(w_gate.dtype), w_gate, w_up, w_down)


CASES = (
    # Train: Mixtral's routing (8 experts, top 2) at narrow widths, and DeepSeek-V2-Lite's (64,
    # top 6) on widths off the 128-lane tile; both on token counts off the 8-row tile, with
    # enough routed rows (2398 and 3000) to span several row blocks of the grouped matmuls.
    case_grid("train", "check", [dict(t=1199, d=256, f=512, e=8)], _DTYPES, params=dict(k=2))
    + case_grid("train", "check", [dict(t=500, d=320, f=192, e=64)], _DTYPES, params=dict(k=6))
    # Held-out: Qwen1.5-MoE's routing (60 experts, top 4) on unaligned widths, a single token
    # through DeepSeek-V2-Lite's, and Phi-3.5-MoE's (16 experts, top 2).
    + case_grid("heldout", "check", [dict(t=90, d=200, f=136, e=60)], _DTYPES, params=dict(k=4))
    + case_grid("heldout", "check", [dict(t=1, d=128, f=256, e=64)], _DTYPES, params=dict(k=6))
    + case_grid("heldout", "check", [dict(t=700, d=384, f=640, e=16)], _DTYPES, params=dict(k=2))
    + case_grid("train", "bench", [dict(t=8192, d=4096, f=14336, e=8)], _DTYPES, params=dict(k=2))
    + case_grid("train", "bench", [dict(t=16384, d=2048, f=1408, e=64)], _DTYPES, params=dict(k=6))
    + case_grid("heldout", "bench", [dict(t=16384, d=2048, f=1408, e=60)], _DTYPES, params=dict(k=4))
    + case_grid("heldout", "bench", [dict(t=8192, d=4096, f=6400, e=16)], _DTYPES, params=dict(k=2))
)

TASK = Task(
    name="moe_layer",
    version=1,
    level=3,
    description=("Mixture-of-experts SwiGLU FFN layer: float32 router logits x @ w_router, top k "
                 "experts per token (equal logits: lowest index first) weighted by a softmax over "
                 "those k logits, out[t] = sum_j p[t, j] * expert_j(x[t]) with "
                 "expert(x) = (silu(x @ w_gate) * (x @ w_up)) @ w_down; float32 accumulation, "
                 "output in x.dtype; k is the length of slots."),
    signature=("kernel(x[t, d], slots[k] int32, w_router[d, e], w_gate[e, d, f], w_up[e, d, f], "
               "w_down[e, f, d]) -> [t, d]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(GATED_MXU_TOLERANCES),
    required_features=("scalar_prefetch",),
    stresses=(Stress("skewed_routing", "a collapsed router: one expert in every token's top k, a few "
                     "others sharing the rest, most experts with no tokens", skewed_inputs),),
)
