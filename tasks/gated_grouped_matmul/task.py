"""gated_grouped_matmul: the gated first half of an MoE expert FFN over tokens sorted by expert.

x[m, k] holds the routed tokens already in expert order: expert i owns the next
group_sizes[i] rows (sum(group_sizes) == m; an expert may get no rows at all). Each expert has
its own gate and up projections, w_gate[i] and w_up[i] of [k, n], and its rows become
silu(x_i @ w_gate[i]) * (x_i @ w_up[i]): the SwiGLU hidden activation that the expert's down
projection then consumes. This is what Megablox's grouped matmul (GMM) computes for the first
two weights of an MoE layer, with the gate fused in so the [m, n] gate and up products never
reach HBM. Products accumulate in float32, the epilogue is float32, the output is in x.dtype.
grouped_matmul (level 3) is the plain, ungated GMM.

Expert counts and widths from the models' configs (hidden_size = k, the expert FFN width = n,
routed experts = e); m is tokens times experts per token:
- Mixtral-8x7B: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
  num_experts_per_tok 2; the train bench routes 8192 tokens (m = 16384).
- DeepSeek-V2-Lite: hidden_size 2048, moe_intermediate_size 1408, n_routed_experts 64,
  num_experts_per_tok 6; the train bench routes 16384 tokens (m = 98304), and a ragged train
  check case keeps its 64 experts at narrow widths.
- Qwen1.5-MoE-A2.7B: hidden_size 2048, moe_intermediate_size 1408, num_experts 60,
  num_experts_per_tok 4 (held out: 60 experts; 16384 tokens, m = 65536).
- Phi-3.5-MoE: hidden_size 4096, intermediate_size 6400, num_local_experts 16,
  num_experts_per_tok 2 (held out: 16 experts and another width; 8192 tokens, m = 16384).
Shapes from: Mixtral-8x7B, DeepSeek-V2-Lite, Qwen1.5-MoE-A2.7B, Phi-3.5-MoE.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

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


def reference(x, w_gate, w_up, group_sizes):
    gate = jax.lax.ragged_dot(x, w_gate, group_sizes, preferred_element_type=jnp.float32)
    up = jax.lax.ragged_dot(x, w_up, group_sizes, preferred_element_type=jnp.float32)
    return (jax.nn.silu(gate) * up).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    weight = ArgSpec((d["e"], d["k"], d["n"]), case.dtype)
    return [ArgSpec((d["m"], d["k"]), case.dtype), weight, weight, ArgSpec((d["e"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def draw_group_sizes(m: int, e: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Seeded rows per expert summing to m, from one of three distributions.

    ragged: e - 1 cut points at distinct odd rows, one of them doubled, so one expert gets no
      rows and no boundary falls on a row block (needs e >= 3 and m >= 2e; else `routed`).
    routed: m tokens routed by a lopsided router (expert shares drawn from a Dirichlet(0.5)):
      some experts get many rows, some few or none.
    skewed: one expert gets all but a few rows, at most one other gets the rest, every other
      expert none (a collapsed router; with m == 1, a single row).
    busy: e - 1 cut points at distinct odd rows: every expert gets rows and no boundary falls
      on a row block, as a router spreading a large batch does. The most (row block, expert)
      pairs a grouped matmul can meet: one per block plus one per boundary (needs m >= 2e).
    """
    if kind in ("ragged", "busy") and e >= 3 and m >= 2 * e:
        cuts = rng.choice(np.arange(1, m, 2), size=e - 2 if kind == "ragged" else e - 1, replace=False)
        if kind == "ragged":
            cuts = np.append(cuts, cuts[rng.integers(e - 2)])
        sizes = np.diff(np.concatenate([[0], np.sort(cuts), [m]]))
    elif kind in ("ragged", "routed", "busy"):
        sizes = rng.multinomial(m, rng.dirichlet(np.full(e, 0.5)))
    elif kind == "skewed":
        sizes = np.zeros(e, np.int64)
        big = int(rng.integers(e))
        small = min(m - 1, int(rng.integers(1, 8))) if e > 1 else 0
        if small > 0:
            sizes[int(rng.choice([i for i in range(e) if i != big]))] = small
        sizes[big] = m - small
    else:
        raise ValueError(f"unknown group distribution {kind!r}")
    assert sizes.sum() == m and (sizes >= 0).all()
    return sizes.astype(np.int32)


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Each expert gets between none and all of the m rows."""
    return [None, None, None, (0, case.dims["m"])]


def _inputs(case: Case, rng: np.random.Generator, kind: str) -> tuple[np.ndarray, ...]:
    x_spec, w_spec, _, _ = arg_specs(case)
    # Weights scaled by 1/sqrt(k): gate and up are O(1), silu in its curved region.
    scale = case.dims["k"] ** -0.5
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=scale),
            normal(rng, w_spec.shape, case.dtype, scale=scale),
            draw_group_sizes(case.dims["m"], case.dims["e"], kind, rng))


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, case.params["groups"])


def skewed_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, "skewed")


def busy_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, "busy")


CASES = (
    # Train: Mixtral's 8 experts at narrow widths (1199 tokens, top 2: rows off the 8-row tile),
    # and DeepSeek-V2-Lite's 64 (500 tokens, top 6: about 47 rows per expert) on widths off the
    # 128-lane tile. Both span several row blocks, so groups straddle block boundaries.
    case_grid("train", "check", [dict(m=2398, k=256, n=512, e=8), dict(m=3000, k=320, n=192, e=64)],
              _DTYPES, params=dict(groups="ragged"))
    # Held-out: Qwen1.5-MoE's 60 experts on unaligned widths under a lopsided router, one row,
    # and Phi-3.5-MoE's 16 experts with one taking nearly every row.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=136, e=60)], _DTYPES,
                params=dict(groups="routed"))
    + case_grid("heldout", "check", [dict(m=1, k=256, n=128, e=16), dict(m=1000, k=128, n=384, e=16)],
                _DTYPES, params=dict(groups="skewed"))
    + case_grid("train", "bench", [dict(m=16384, k=4096, n=14336, e=8),
                                   dict(m=98304, k=2048, n=1408, e=64)], _DTYPES,
                params=dict(groups="ragged"))
    + case_grid("heldout", "bench", [dict(m=65536, k=2048, n=1408, e=60),
                                     dict(m=16384, k=4096, n=6400, e=16)], _DTYPES,
                params=dict(groups="routed"))
)

TASK = Task(
    name="gated_grouped_matmul",
    version=2,
    level=2,
    description=("MoE expert gate and up projections as one grouped matmul: consecutive row groups "
                 "of x, sized by group_sizes (some may be empty), each become "
                 "silu(x_i @ w_gate[i]) * (x_i @ w_up[i]); float32 accumulation and epilogue, "
                 "output in x.dtype."),
    signature="kernel(x[m, k], w_gate[e, k, n], w_up[e, k, n], group_sizes[e] int32) -> [m, n]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(GATED_MXU_TOLERANCES),
    required_features=("scalar_prefetch",),
    stresses=(Stress("skewed_groups", "one expert with nearly every row and most experts with none, as a "
                     "collapsed router sends", skewed_inputs),
              Stress("busy_groups", "every expert with rows and every group boundary inside a row block, as "
                     "a router spreading a large batch sends: the most (row block, expert) pairs", busy_inputs)),
)
