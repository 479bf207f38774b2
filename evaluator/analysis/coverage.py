"""Coverage of every grid axis: check cases that run each axis a kernel tiles at bench sizes.

Check sizes are small, so a kernel tuned for bench sizes (blocks of 1024 and more) often covers
every check case in one block along an axis it tiles at bench sizes. A bug that needs two
blocks to show (an accumulator zeroed once, a K index ignored by an index map, a carry lost
between blocks, a block offset never added) then never runs. This module finds such axes from
the grids traced at check and bench sizes, and derives extra check cases in which each of them
runs at least two full blocks, plus a ragged tail where the task's own cases are ragged along
that dimension; the other dimensions stay at check scale.

Pure functions over traced summaries and cases: the coverage stage (evaluator/stages.py) drives
the worker, these decide.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import reduce
from typing import Iterable

from evaluator.analysis.jaxpr_analysis import TraceSummary
from tasks.spec import Case, Task

# A dimension whose values in the task's cases are all multiples of this is "aligned": no
# ragged tail is added along it (the task never promises a ragged size there).
RAGGED_QUANTUM = 128
# A derived case may hold at most this many times the elements (inputs plus outputs) of the
# largest check case of its split; past that, one case per dimension is derived instead of one
# case for all, and a single dimension that still does not fit is left uncovered (and said so).
MAX_ELEMENTS_FACTOR = 16
_SHORT = {"float32": "f32", "bfloat16": "bf16"}  # as tasks.spec.case_grid names cases


@dataclass(frozen=True)
class AxisGap:
    """A grid axis that runs more than one step at a bench case but one step at every check case."""

    kernel: str  # the pallas_call's kernel name, with its occurrence index when repeated
    axis: int
    bench: str  # the bench case where it has several steps
    bench_steps: int

    def describe(self) -> str:
        return f"axis {self.axis} of {self.kernel} ({self.bench_steps} steps at {self.bench})"


@dataclass
class CoveragePlan:
    """What the coverage stage found and added: `cases` are the derived check cases, `axes`
    lists which axes ran how many steps per run case (filled once the cases are traced),
    `uncovered` says which gaps no derived case closes, and why."""

    gaps: list[AxisGap] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)
    derived_from: dict[str, str] = field(default_factory=dict)  # derived case -> bench case
    runs: dict[str, list[str]] = field(default_factory=dict)  # derived case -> the gaps it runs
    uncovered: list[str] = field(default_factory=list)

    def add(self, case: Case, bench: Case, summary: TraceSummary) -> None:
        self.cases.append(case)
        self.derived_from[case.name] = bench.name
        self.runs[case.name] = [f"axis {g.axis} of {g.kernel} runs {steps} steps"
                                for g, steps in drives(summary, self.gaps)]

    def to_details(self, steps: dict[str, dict[str, list[int]]]) -> dict:
        return {"steps": steps, "added": [{"case": c.name, "from": self.derived_from[c.name],
                                           "runs": self.runs[c.name], "dims": dict(c.dims), "dtype": c.dtype}
                                          for c in self.cases],
                "gaps": [g.describe() for g in self.gaps], "uncovered": list(self.uncovered)}


def failure_note(details: dict | None, case_name: str) -> str:
    """For feedback on a failing derived case: why it exists and what kind of bug it shows."""
    added = {a["case"]: a for a in (details or {}).get("added", [])}
    if case_name not in added:
        return ""
    entry = added[case_name]
    return (f" Case {case_name} was added from bench case {entry['from']} so that more than one block "
            f"runs ({'; '.join(entry['runs'])}), where the task's check cases run one: look for a bug "
            "that needs two blocks (an accumulator or carry reset or lost between blocks, an index map "
            "that ignores a grid index, a block offset never added, a missing halo).")


def kernel_grids(summary: TraceSummary) -> dict[str, list[int]]:
    """Each pallas_call's grid, keyed by kernel name (`name#2` for its second occurrence), so that
    the same kernel is compared across sizes even when other kernels come and go."""
    seen: dict[str, int] = {}
    grids: dict[str, list[int]] = {}
    for call in summary.pallas_calls:
        n = seen.get(call.name, 0)
        seen[call.name] = n + 1
        grids[call.name if n == 0 else f"{call.name}#{n + 1}"] = list(call.grid)
    return grids


def axis_gaps(checks: Iterable[TraceSummary], bench_cases: Iterable[tuple[str, TraceSummary]]) -> list[AxisGap]:
    """Axes with more than one step at some bench case and at most one at every check case.
    A kernel that runs only at bench sizes has all its multi-step axes listed."""
    check_grids = [kernel_grids(s) for s in checks]
    gaps: dict[tuple[str, int], AxisGap] = {}
    for bench_name, summary in bench_cases:
        for kernel, grid in kernel_grids(summary).items():
            for axis, steps in enumerate(grid):
                if steps <= 1 or (kernel, axis) in gaps:
                    continue
                covered = any(kernel in g and axis < len(g[kernel]) and g[kernel][axis] > 1
                              for g in check_grids)
                if not covered:
                    gaps[(kernel, axis)] = AxisGap(kernel, axis, bench_name, steps)
    return list(gaps.values())


def base_case(task: Task, split: str, bench: Case) -> Case:
    """The check case a derived case starts from: the largest of the split's check cases with
    the bench case's dtype and params, else with its dtype, else of any kind."""
    checks = task.select(split, "check")
    for keep in (lambda c: c.dtype == bench.dtype and c.params == bench.params,
                 lambda c: c.dtype == bench.dtype, lambda c: True):
        fitting = [c for c in checks if keep(c)]
        if fitting:
            return max(fitting, key=lambda c: elements(task, c))
    raise ValueError(f"task {task.name} has no check case in split {split}")


def elements(task: Task, case: Case) -> int:
    """Elements of a case's inputs and outputs: what interpret mode copies around."""
    return sum(math.prod(a.shape) for a in (*task.arg_specs(case), *task.out_specs(case)))


def probe_cases(base: Case, bench: Case) -> dict[str, Case]:
    """One case per dimension that differs between `base` and `bench`: `base` with that one
    dimension at its bench value. Traced (never run), they show which dimension drives which
    grid axis."""
    probes = {}
    for dim, value in bench.dims.items():
        if base.dims.get(dim) != value:
            probes[dim] = dataclasses.replace(base, name=f"{base.name}__probe_{dim}",
                                              dims={**base.dims, dim: value})
    return probes


def drives(probe: TraceSummary, gaps: list[AxisGap]) -> list[tuple[AxisGap, int]]:
    """The gaps whose axis has several steps at the probe, with those steps."""
    grids = kernel_grids(probe)
    return [(g, grids[g.kernel][g.axis]) for g in gaps
            if g.kernel in grids and g.axis < len(grids[g.kernel]) and grids[g.kernel][g.axis] > 1]


def quantum(task: Task, dim: str) -> int:
    """The step between sizes the task's cases use along `dim`: the gcd of their values."""
    values = [c.dims[dim] for c in task.cases if dim in c.dims]
    return reduce(math.gcd, values) if values else 1


def covering_size(task: Task, dim: str, bench_value: int, steps_at_bench: int) -> int:
    """A size along `dim` with at least two full blocks, plus a partial block (half a block,
    rounded down to the task's quantum) where the task's cases are ragged along `dim`. The block
    is inferred from the bench grid (bench value / steps, rounded up), and never exceeds the
    bench value."""
    block = -(-bench_value // steps_at_bench)
    size = 2 * block
    q = quantum(task, dim)
    if q % RAGGED_QUANTUM:
        tail = (block // 2) // q * q
        size += tail if tail > 0 else q
    return min(size, bench_value)


def derived_case(base: Case, bench: Case, sizes: dict[str, int]) -> Case:
    dims = {**base.dims, **sizes}
    label = "_".join(f"{k}{v}" for k, v in dims.items())
    return dataclasses.replace(base, name=f"{bench.split}_cover_{label}_{_SHORT.get(base.dtype, base.dtype)}", split=bench.split,
                               dims=dims)


def plan_cases(task: Task, base: Case, bench: Case, sizes: dict[str, int],
               max_elements: int) -> tuple[list[Case], list[str]]:
    """One case with every covering size when it fits the element budget; else one case per
    dimension; a dimension that does not fit alone is reported, not run."""
    whole = derived_case(base, bench, sizes)
    if elements(task, whole) <= max_elements or len(sizes) == 1:
        if elements(task, whole) <= max_elements:
            return [whole], []
        dim, value = next(iter(sizes.items()))
        return [], [f"{dim}={value} would make a case of {elements(task, whole):,} elements, over the "
                    f"budget of {max_elements:,}"]
    cases, skipped = [], []
    for dim, value in sizes.items():
        one, why = plan_cases(task, base, bench, {dim: value}, max_elements)
        cases += one
        skipped += why
    return cases, skipped


def steps_table(summaries: dict[str, TraceSummary], cases: Iterable[Case]) -> dict[str, dict[str, list[int]]]:
    """Per run case, the steps each kernel's grid axes ran: `details.coverage.steps`."""
    return {c.name: kernel_grids(summaries[c.name]) for c in cases if c.name in summaries}


def still_uncovered(gaps: list[AxisGap], summaries: list[TraceSummary]) -> list[AxisGap]:
    """The gaps that none of `summaries` runs with more than one step."""
    return [g for g in gaps if not any(drives(s, [g]) for s in summaries)]
