"""What a pallas_call moves between HBM and VMEM, and computes, as its pipeline runs.

Used by the static performance model (evaluator/performance/perf_model.py). The Pallas TPU pipeline
copies an input block in when its block index differs from the previous grid step's, and
writes an output block back when its index is about to change (and at the end); so the
traffic of a blocked operand is (1 + number of index changes along the grid) x block bytes.
We get the index sequence by evaluating the BlockSpec's index map at every grid point.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from evaluator.analysis.grid_conds import GridConds, grid_cond_branches
from evaluator.analysis.jaxpr_cost import Cost, walk

MAX_GRID_POINTS = 1 << 22  # beyond this, assume a fetch on every step instead of evaluating


def block_fetches(block_mapping: Any, grid: tuple[int, ...]) -> int | None:
    """How many times the pipeline copies this block; None if its index map reads
    prefetched scalars (data-dependent) or the grid is too large to walk."""
    closed = block_mapping.index_map_jaxpr
    steps = math.prod(grid)
    # With scalar prefetch the index map also receives the prefetched refs; only a map that
    # reads them depends on the data.
    prefetched = closed.jaxpr.invars[len(grid):]
    if len(closed.jaxpr.invars) < len(grid) or steps > MAX_GRID_POINTS or _reads(closed.jaxpr, prefetched):
        return None
    if steps <= 1:
        return steps
    # Grid points in iteration order: lexicographic, last axis fastest.
    points = np.indices(grid).reshape(len(grid), -1).astype(np.int32)
    stacked = block_indices(block_mapping, points, len(grid))  # [block dims, steps]
    changes = int(np.count_nonzero(np.any(stacked[:, 1:] != stacked[:, :-1], axis=0)))
    return 1 + changes


def block_indices(block_mapping: Any, points: np.ndarray, n_grid: int) -> np.ndarray:
    """The block indices its index map returns at every grid point (`points`: [grid dims,
    steps], in iteration order): [block dims, steps]. The map must not read prefetched
    scalars (`reads_prefetched`): they are passed as None."""
    import jax

    closed = block_mapping.index_map_jaxpr
    unread = [None] * (len(closed.jaxpr.invars) - n_grid)
    steps = points.shape[1]
    if n_grid == 0:
        out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *unread)
    else:
        out = jax.vmap(lambda *idx: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *idx, *unread))(*points)
    if not out:
        return np.zeros((0, steps), np.int64)
    return np.stack([np.broadcast_to(np.asarray(i, np.int64).reshape(-1), (steps,)) for i in out])


def reads_prefetched(block_mapping: Any, n_grid: int) -> bool:
    """Whether a block's index map reads the prefetched scalars it is given after the grid
    indices (a data-dependent block index: paged attention's page table)."""
    jaxpr = block_mapping.index_map_jaxpr.jaxpr
    return _reads(jaxpr, jaxpr.invars[n_grid:])


def _reads(jaxpr: Any, variables: list) -> bool:
    """Whether any equation of `jaxpr` (or its result) uses one of `variables`."""
    wanted = {id(v) for v in variables}
    if not wanted:
        return False
    used = [v for eqn in jaxpr.eqns for v in eqn.invars] + list(jaxpr.outvars)
    return any(id(v) in wanted for v in used)


def kernel_cost_per_step(kernel_jaxpr: Any, trips: Mapping[int, int | None] | None = None,
                         grid: tuple[int, ...] | None = None) -> tuple[Cost, GridConds | None]:
    """FLOPs and bytes copied by manual DMAs for one grid step of the kernel body, the mean
    over the steps of `grid` (when it is static); and the branches its grid-decided conds take.

    Matmuls count 2 x output x contraction, other arithmetic one per element; loops count
    their trip count (a while loop its maximum from `trips`, evaluator/analysis/intervals.py, else
    once and flagged). A pl.when whose predicate depends on the grid position (and loop
    counters) alone counts on the steps that take it (evaluator/analysis/grid_conds.py), any other
    its dearer branch. A DMA moves its destination's bytes as indexed (a slot of a VMEM
    buffer filled from a slice of an HBM array).
    """
    conds = grid_cond_branches(kernel_jaxpr, grid, trips) if grid is not None else None
    return walk(kernel_jaxpr, trips, grid_conds=conds), conds
