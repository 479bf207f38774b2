"""Coverage of every iteration the bench program takes: check cases that run each grid axis and
each in-kernel loop that bench sizes iterate, at least three steps, in every bench dtype.

Check sizes are small, so a kernel tuned for bench sizes (blocks of 1024 and more) often covers
every check case in one block along an axis it tiles at bench sizes, and a loop over chunks
inside the body (`fori_loop` over K, over kv tiles) runs once. A bug that needs several steps
to show then never runs: an accumulator zeroed once, a K index ignored by an index map, a carry
lost between blocks, a block offset never added; and some need three, since the second step is
the first to read a carry and the third the first to read one written by a step that read one
(a running statistic read stale, an offset taken from the first block only). This module finds
such iteration spaces (`spaces`: grid axes and loops, by kernel) from the programs traced at
check and bench sizes, and derives extra check cases in which each runs at least NEEDED_STEPS
full steps (or all of its bench steps, when fewer), plus a ragged tail where the task's own
cases are ragged along that dimension, in the bench case's dtype and params; the other
dimensions stay at check scale.

Pure functions over traced summaries and cases: the coverage stage (evaluator/stages.py) drives
the worker, these decide.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import reduce
from typing import Iterable

import numpy as np

from evaluator.analysis.jaxpr_analysis import TraceSummary
from tasks.spec import Case, Task

# A dimension whose values in the task's cases are all multiples of this is "aligned": no
# ragged tail is added along it (the task never promises a ragged size there).
RAGGED_QUANTUM = 128
# A derived case may hold at most this many times the elements (inputs plus outputs) of the
# task's largest check case (either split); past that, one case per dimension is derived instead of one
# case for all, and a single dimension that still does not fit is left uncovered (and said so).
MAX_ELEMENTS_FACTOR = 16
# A gap no one dimension moves (a column slab that narrows with k and the group count, for VMEM)
# is tried with every dimension but one at its bench value (`joint_probes`); such a case may
# hold up to this many times the elements of the task's largest check case.
JOINT_ELEMENTS_FACTOR = 64
# Steps every grid axis and loop must run at some run case, where bench sizes run that many or
# more: the third step is the first whose carry was written by a step that read one.
NEEDED_STEPS = 3
_SHORT = {"float32": "f32", "bfloat16": "bf16"}  # as tasks.spec.case_grid names cases


@dataclass(frozen=True)
class AxisGap:
    """Part of the bench program no check case of that dtype runs: an iteration space (a grid
    axis, or a loop of the body) short of NEEDED_STEPS steps, or a branch of a grid-decided
    cond that no check case takes (a step skipped, a block handled otherwise)."""

    kernel: str  # the pallas_call's kernel name, with its occurrence index when repeated
    space: str   # "axis 0" (a grid axis), "loop 0" (the body's first loop), "cond 0 branch 1"
    bench: str   # the bench case where it runs
    bench_steps: int
    dtype: str = ""

    @property
    def branch(self) -> bool:
        return self.space.startswith("cond ")

    @property
    def needed(self) -> int:
        return 1 if self.branch else min(NEEDED_STEPS, self.bench_steps)

    def _branch_words(self) -> str:
        _, cond, _, branch = self.space.split()
        return f"branch {branch} of cond {cond}"

    def describe(self) -> str:
        if self.branch:
            return f"{self._branch_words()} in {self.kernel} (taken at {self.bench})"
        return f"{self.space} of {self.kernel} ({self.bench_steps} steps at {self.bench})"

    def ran(self, steps: int) -> str:
        """What a run case that closes this gap does, in words."""
        if self.branch:
            return f"{self.kernel} takes {self._branch_words()}"
        return f"{self.space} of {self.kernel} runs {steps} steps"

    def unrun(self) -> str:
        return "no run case takes it" if self.branch else f"no derived case runs it {self.needed} steps"


@dataclass
class CoveragePlan:
    """What the coverage stage found and added: `cases` are the derived check cases, `steps`
    (in details) which spaces ran how many steps per run case (filled once the cases are
    traced), `uncovered` which gaps no derived case closes, and why."""

    gaps: list[AxisGap] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)
    derived_from: dict[str, str] = field(default_factory=dict)  # derived case -> bench case
    runs: dict[str, list[str]] = field(default_factory=dict)  # derived case -> the gaps it runs
    uncovered: list[str] = field(default_factory=list)

    def add(self, case: Case, bench: Case, summary: TraceSummary) -> None:
        self.cases.append(case)
        self.derived_from[case.name] = bench.name
        self.runs[case.name] = [g.ran(steps) for g, steps in drives(summary, [g for g in self.gaps
                                                                           if g.dtype == case.dtype])]

    def prune(self, summaries: dict[str, TraceSummary]) -> None:
        """Drop the derived cases that close no gap (another case ran what they were for)."""
        def closes(case: Case) -> bool:
            mine = [g for g in self.gaps if g.dtype == case.dtype]
            return any(steps >= g.needed for g, steps in drives(summaries[case.name], mine))

        self.cases = [c for c in self.cases if closes(c)]
        kept = {c.name for c in self.cases}
        self.derived_from = {name: b for name, b in self.derived_from.items() if name in kept}
        self.runs = {name: r for name, r in self.runs.items() if name in kept}

    def to_details(self, steps: dict[str, dict[str, dict[str, int]]]) -> dict:
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
    return (f" Case {case_name} was added from bench case {entry['from']} so that each grid axis and loop "
            f"runs several steps ({'; '.join(entry['runs'])}), where the task's check cases run fewer: look "
            "for a bug that needs several blocks or loop steps (an accumulator or carry reset, lost or read "
            "stale between steps, an index map that ignores a grid index, a block offset never added or "
            "taken from the first block only, a missing halo).")


def spaces(summary: TraceSummary) -> dict[str, dict[str, int]]:
    """Each pallas_call's grid axes and loops with their steps ({"axis 0": 4, "loop 0": 8}),
    and the branches its grid-decided conds take ({"cond 0 branch 1": 1}), keyed by kernel
    (PallasCallInfo.key, `key#2` for its second occurrence), so that the same kernel is compared
    across sizes even when other kernels come and go or its name carries its shapes. A loop of
    unknown trip count (-1) and a cond the grid does not decide are left out: nothing to compare."""
    seen: dict[str, int] = {}
    out: dict[str, dict[str, int]] = {}
    for call in summary.pallas_calls:
        n = seen.get(call.key, 0)
        seen[call.key] = n + 1
        found = {f"axis {i}": steps for i, steps in enumerate(call.grid)}
        found.update({f"loop {i}": trips for i, trips in enumerate(call.loop_trips) if trips >= 0})
        found.update({f"cond {i} branch {b}": 1 for i, taken in enumerate(call.branches) for b in taken or ()})
        out[call.key if n == 0 else f"{call.key}#{n + 1}"] = found
    return out


def axis_gaps(checks: Iterable[tuple[str, TraceSummary]], bench_cases: Iterable[tuple[Case, TraceSummary]]
              ) -> list[AxisGap]:
    """Spaces with more than one step at some bench case, and fewer than min(NEEDED_STEPS,
    those steps) at every check case of the bench case's dtype (`checks`: (dtype, summary)).
    A kernel that runs only at bench sizes has all its multi-step spaces listed."""
    check_spaces = [(dtype, spaces(s)) for dtype, s in checks]
    gaps: dict[tuple[str, str, str], AxisGap] = {}
    for bench, summary in bench_cases:
        for kernel, found in spaces(summary).items():
            for space, steps in found.items():
                key = (kernel, space, bench.dtype)
                gap = AxisGap(kernel, space, bench.name, steps, bench.dtype)
                if (steps <= 1 and not gap.branch) or key in gaps:
                    continue
                covered = any(dtype == bench.dtype and c.get(kernel, {}).get(space, 0) >= gap.needed
                              for dtype, c in check_spaces)
                if not covered:
                    gaps[key] = gap
    return list(gaps.values())


def base_case(task: Task, split: str, bench: Case) -> Case:
    """The case derived cases start from: the smallest (a derived case grows one of its
    dimensions, and costs what it holds) of the split's check cases with the bench case's split,
    dims (by name) and dtype, else with its dims and dtype, else with its dtype, else of any
    kind; in the bench case's dtype and params, where they differ under the name
    `<check case>__as_<bench case>` (traced by the coverage stage like a probe)."""
    checks = task.select(split, "check")
    same = lambda c: c.dtype == bench.dtype and set(c.dims) == set(bench.dims)
    for keep in (lambda c: same(c) and c.split == bench.split, same, lambda c: c.dtype == bench.dtype,
                 lambda c: True):
        fitting = [c for c in checks if keep(c)]
        if fitting:
            base = min(fitting, key=lambda c: (elements(task, c), c.name))
            if (base.dtype, base.params) == (bench.dtype, bench.params):
                return base
            return _fitted(task, dataclasses.replace(base, name=f"{base.name}__as_{bench.name}", dtype=bench.dtype,
                                                     params=dict(bench.params)))
    raise ValueError(f"task {task.name} has no check case in split {split}")


def _fitted(task: Task, case: Case) -> Case:
    """The case with its dimensions made to agree where the task needs them to (Task.fit_case)."""
    return task.fit_case(case) if task.fit_case is not None else case


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


def joint_probes(base: Case, bench: Case) -> dict[str, Case]:
    """Per dimension that differs between `base` and `bench`: `base` with every other differing
    dimension at its bench value. Traced where no one dimension moves a gap, they find the
    dimension its space does not depend on, which stays small. With two differing dimensions,
    leaving one out is a single-dimension probe: the one joint probe has both at their bench
    values (keyed "")."""
    differing = [dim for dim, value in bench.dims.items() if base.dims.get(dim) != value]
    if len(differing) == 2:
        return {"": dataclasses.replace(base, name=f"{base.name}__joint", dims={**base.dims, **{
            d: bench.dims[d] for d in differing}})}
    if len(differing) < 2:
        return {}
    return {dim: dataclasses.replace(base, name=f"{base.name}__joint_but_{dim}",
                                     dims={**base.dims, **{d: bench.dims[d] for d in differing if d != dim}})
            for dim in differing}


def ragged_probes(task: Task, gaps: list[AxisGap], probes: dict[str, tuple[Case, TraceSummary]]) -> dict[str, Case]:
    """Each probe along a dimension the task's cases are ragged in, cut by half a block (rounded
    to the task's quantum; the block: the probe's size over its steps on `gaps`), so that its
    last block is partial where the kernel keeps its block size: the bench value may divide
    evenly, and a kernel that drops a tail (a floor for a ceiling) is wrong only where one is.
    Traced beside the probes, the smaller of the two that runs a gap its needed steps is run."""
    out = {}
    for dim, (case, summary) in probes.items():
        q = quantum(task, dim)
        steps = max((s for _, s in drives(summary, gaps)), default=0)
        if not q % RAGGED_QUANTUM or steps < 2:
            continue
        value = case.dims[dim] - ragged_tail(-(-case.dims[dim] // steps), q)
        out[f"{dim} ragged"] = dataclasses.replace(case, name=f"{case.name}_ragged", dims={**case.dims, dim: value})
    return out


def cases_from_probes(task: Task, bench: Case, gaps: list[AxisGap], probes: dict[str, tuple[Case, TraceSummary]],
                      max_elements: int) -> tuple[list[Case], list[AxisGap]]:
    """For each gap, the smallest probe that runs it its needed steps (a space whose steps do
    not follow its dimension in proportion, a branch only a bench value takes, a space several
    dimensions drive: joint_probes), as a derived case (in the bench case's dtype and params)
    when it fits `max_elements`; and the gaps none does."""
    chosen: dict[str, Case] = {}
    left = []
    for gap in gaps:
        fitting = [case for case, summary in probes.values()
                   if any(steps >= gap.needed for _, steps in drives(summary, [gap]))
                   and elements(task, case) <= max_elements]
        if not fitting:
            left.append(gap)
            continue
        case = min(fitting, key=lambda c: elements(task, c))
        chosen.setdefault(case.name, case)
    return [derived_case(task, case, bench, {}) for case in chosen.values()], left


def drives(probe: TraceSummary, gaps: list[AxisGap]) -> list[tuple[AxisGap, int]]:
    """The gaps whose space has several steps at the probe (a branch: is taken there), with
    those steps."""
    found = spaces(probe)
    return [(g, steps) for g in gaps if (steps := found.get(g.kernel, {}).get(g.space, 0)) > (0 if g.branch else 1)]


def choose_sizes(task: Task, base: Case, bench: Case, gaps: list[AxisGap], at_base: TraceSummary,
                 probes: dict[str, TraceSummary]) -> dict[str, int]:
    """Which dimensions to grow, and to what, so that each gap runs its needed steps: per gap,
    of the dimensions whose probe moves its space (runs it more steps than `base` does;
    `probes`: dim -> the traced probe), one already grown for another gap where there is one,
    else the one whose derived case is smallest. A gap no probe moves gets nothing (its space
    depends on several dimensions at once, or on none): the caller reports it."""
    before = spaces(at_base)
    sizes: dict[str, int] = {}
    for gap in gaps:
        base_steps = before.get(gap.kernel, {}).get(gap.space, 1)
        moved = {dim: steps for dim, probe in probes.items() for _, steps in drives(probe, [gap]) if steps > base_steps}
        options = {dim: covering_size(task, dim, bench.dims[dim], steps) for dim, steps in moved.items()}
        # Where some dimension's covering size reaches the needed steps (its block: the bench
        # value over the probe's steps), only those: another grows to no avail.
        reaching = {dim: size for dim, size in options.items()
                    if -(-size // -(-bench.dims[dim] // moved[dim])) >= gap.needed}
        options = reaching or options
        if not options:
            continue
        shared = [dim for dim in options if dim in sizes]
        dim = shared[0] if shared else min(
            options, key=lambda d: (elements(task, derived_case(task, base, bench, {d: options[d]})), d))
        sizes[dim] = max(sizes.get(dim, 0), options[dim])
    return sizes


def quantum(task: Task, dim: str) -> int:
    """The step between sizes the task's cases use along `dim`: the gcd of their values."""
    values = [c.dims[dim] for c in task.cases if dim in c.dims]
    return reduce(math.gcd, values) if values else 1


def covering_size(task: Task, dim: str, bench_value: int, steps_at_bench: int) -> int:
    """A size along `dim` that runs NEEDED_STEPS steps (a block: what one grid step or loop
    iteration covers): NEEDED_STEPS full blocks, or, where the task's cases are ragged along
    `dim`, one fewer and a partial last block (half a block, rounded down to the task's
    quantum). The block is inferred from the steps at the bench value (bench value / steps,
    rounded up), and the size never exceeds the bench value."""
    block = -(-bench_value // steps_at_bench)
    q = quantum(task, dim)
    if q % RAGGED_QUANTUM:
        size = (NEEDED_STEPS - 1) * block + ragged_tail(block, q)
    else:
        size = NEEDED_STEPS * block
    return min(size, bench_value)


def ragged_tail(block: int, q: int) -> int:
    """A partial last block: half a block, rounded down to the task's quantum `q`, at least `q`."""
    return max(q, block // 2 // q * q)


def derived_case(task: Task, base: Case, bench: Case, sizes: dict[str, int]) -> Case:
    """`base` with `sizes`, in the bench case's dtype and params (the code path the bench
    takes), its dimensions made to agree where the task needs them to (Task.fit_case)."""
    case = _fitted(task, dataclasses.replace(base, split=bench.split, dims={**base.dims, **sizes},
                                             dtype=bench.dtype, params=dict(bench.params)))
    label = "_".join(f"{k}{v}" for k, v in case.dims.items())
    return dataclasses.replace(case, name=f"{bench.split}_cover_{label}_{_SHORT.get(bench.dtype, bench.dtype)}")


def inputs_problem(task: Task, case: Case) -> str | None:
    """Why the task cannot make inputs at a derived case (its own rules on its dimensions and
    params, in its input maker's words), or None: such a case is reported, not run."""
    try:
        task.arg_specs(case)
        task.make_inputs(case, np.random.default_rng(0))
    except (ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
        return f"the task cannot make inputs at {case.describe()}: {exc}"
    return None


def plan_cases(task: Task, base: Case, bench: Case, sizes: dict[str, int],
               max_elements: int) -> tuple[list[Case], list[str]]:
    """One case with every covering size when it fits the element budget; else one case per
    dimension; a dimension that does not fit alone is reported, not run."""
    if not sizes:
        return [], []
    whole = derived_case(task, base, bench, sizes)
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


def steps_table(summaries: dict[str, TraceSummary], cases: Iterable[Case]) -> dict[str, dict[str, dict[str, int]]]:
    """Per run case, the steps each kernel's grid axes and loops ran: `details.coverage.steps`."""
    return {c.name: spaces(summaries[c.name]) for c in cases if c.name in summaries}


def still_uncovered(gaps: list[AxisGap], summaries: list[TraceSummary]) -> list[AxisGap]:
    """The gaps that none of `summaries` runs with their needed steps."""
    return [g for g in gaps if not any(steps >= g.needed for s in summaries for _, steps in drives(s, [g]))]
