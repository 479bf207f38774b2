"""grouped_matmul: rows of lhs[m, k] in consecutive groups, group i times rhs[i] -> [m, n].

Group i owns the next group_sizes[i] rows of lhs (sum(group_sizes) == m) and multiplies them
by rhs[i]. The same operation as jax.lax.ragged_dot (MoE expert layers). Output in lhs.dtype,
accumulated in float32.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(lhs, rhs, group_sizes):
    out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
    return out.astype(lhs.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype),
            ArgSpec((d["g"], d["k"], d["n"]), case.dtype),
            ArgSpec((d["g"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def group_sizes(case: Case, rng: np.random.Generator, kind: str | None = None) -> np.ndarray:
    """Seeded group sizes summing to m, drawn from `kind` (the case's `groups` distribution by
    default).

    ragged: g - 1 cut points at distinct odd rows, one of them doubled, so exactly one group
      is empty and every group boundary is odd (never aligned to a row block). Needs g >= 3.
    skewed: one group owns all but a few rows, at most one other is non-empty, the rest are
      empty (with m == 1: a single non-empty group of one row).
    busy: g - 1 cut points at distinct odd rows: every group non-empty and no boundary on a
      row block, as a router spreading a large batch gives. The most (row block, group) pairs
      a grouped matmul can meet: one per block plus one per boundary.
    """
    m, g = case.dims["m"], case.dims["g"]
    kind = kind or case.params["groups"]
    if kind in ("ragged", "busy"):
        if g < 3 or m < 2 * g:
            raise ValueError(f"{case.name}: {kind} groups need g >= 3 and m >= 2g")
        cuts = rng.choice(np.arange(1, m, 2), size=g - 2 if kind == "ragged" else g - 1, replace=False)
        if kind == "ragged":
            cuts = np.append(cuts, cuts[rng.integers(g - 2)])
        sizes = np.diff(np.concatenate([[0], np.sort(cuts), [m]]))
    elif kind == "skewed":
        sizes = np.zeros(g, np.int64)
        big = int(rng.integers(g))
        small = min(m - 1, int(rng.integers(1, 8)))
        if small > 0:
            sizes[int(rng.choice([i for i in range(g) if i != big]))] = small
        sizes[big] = m - small
    else:
        raise ValueError(f"{case.name}: unknown group distribution {kind!r}")
    assert sizes.sum() == m and (sizes >= 0).all() and ((sizes == 0).any() or kind == "busy")
    return sizes.astype(np.int32)


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Each group holds between none and all of the m rows."""
    return [None, None, (0, case.dims["m"])]


def make_inputs(case: Case, rng: np.random.Generator, groups: str | None = None) -> tuple[np.ndarray, ...]:
    lhs_spec, rhs_spec, _ = arg_specs(case)
    # rhs scaled by 1/sqrt(k) so every output element is O(1) whatever k is.
    return (normal(rng, lhs_spec.shape, case.dtype),
            normal(rng, rhs_spec.shape, case.dtype, scale=case.dims["k"] ** -0.5),
            group_sizes(case, rng, groups))


def busy_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return make_inputs(case, rng, "busy")


CASES = (
    case_grid("train", "check", [dict(m=600, k=256, n=256, g=5), dict(m=390, k=320, n=384, g=4)],
              _DTYPES, params=dict(groups="ragged"))
    # Held-out cases differ in kind: unaligned k and n, one huge group with several empty
    # ones, a single row, more groups than any train case.
    + case_grid("heldout", "check", [dict(m=300, k=200, n=136, g=7), dict(m=1, k=256, n=128, g=3)],
                _DTYPES, params=dict(groups="skewed"))
    + case_grid("heldout", "check", [dict(m=1000, k=128, n=256, g=9)], _DTYPES,
                params=dict(groups="ragged"))
    + case_grid("train", "bench", [dict(m=8192, k=2048, n=2048, g=8)], _DTYPES,
                params=dict(groups="ragged"))
    + case_grid("heldout", "bench", [dict(m=6000, k=1000, n=3000, g=12)], _DTYPES,
                params=dict(groups="skewed"))
)

TASK = Task(
    name="grouped_matmul",
    version=3,
    level=3,
    description=("Grouped (ragged) matmul as in MoE layers: consecutive row groups of lhs, "
                 "sized by group_sizes, each times its own rhs[i]; float32 accumulation, "
                 "output in lhs.dtype."),
    signature="kernel(lhs[m, k], rhs[g, k, n], group_sizes[g] int32) -> [m, n]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
    required_features=("scalar_prefetch",),
    stresses=(Stress("busy_groups", "every group non-empty and every boundary inside a row block, as a "
                     "router spreading a large batch gives: the most (row block, group) pairs", busy_inputs),),
)
