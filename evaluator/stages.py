"""The evaluator's stages, in order. The first that fails gives the verdict.

Each stage is a small function from the grading context to either None ("go on") or a
Failure. Stages 1-2 run here on the source text; stages 3-8 drive a sandboxed worker (see
evaluator/execution/worker.py) and judge what it reports. Adding a stage is adding one entry to STAGES,
with the context fields it reads and writes.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from evaluator.analysis import coverage, features as feature_checks, grid_checks, intermediates, one_program, precision
from evaluator.analysis.jaxpr_analysis import TraceSummary
from evaluator.analysis.provenance import KernelOrigin
from evaluator.candidate import policy
from evaluator.candidate.errors import INTERPRETER_FAULT
from evaluator.candidate.extract import ExtractionError, extract_code
from evaluator.execution import step_limits
from evaluator.execution.backends import Backend
from evaluator.execution.protocol import CaseSpec, Compile, Failed, Load, Lower, Ran, Run, SeedResult, Time, Trace
from evaluator.execution.sandbox import Limits, Worker, WorkerError
from evaluator.performance import perf_model, prediction
from evaluator.performance.calibration import Calibration
from evaluator.performance.hardware import (MiB, TpuGeneration, buffers, pipelined_blocks, vmem_budget,
                                            vmem_lower_bound)
from evaluator.performance.xla_cost import XlaProgramCost
from evaluator.record import BlockFigure, CaseResult, Status, Verdict, VmemFinding
from evaluator.truth import stress
from evaluator.truth.compare import compare
from evaluator.truth.reference import ReferenceCache, case_seeds
from evaluator.truth.xla_reference import ReferenceCosts
from tasks.spec import CandidateFormatError, Case, Task

# Work outside kernels above this share of the reference's FLOPs is "a real part of the task".
OUTSIDE_FLOPS_SHARE = 0.10
# Kernels that do at least this share of the task's arithmetic at the check sizes are judged at
# bench sizes by what they did there: the same share, less the task's work_slack (an exact
# rewrite that needs less arithmetic everywhere is judged by the one-program rule instead) ...
INSIDE_FLOPS_SHARE = 0.5
# ... and their static estimate may not beat the ideal kernel (every input read once, every
# output written once, the reference's FLOPs, matmuls at the bf16 rate whatever the dtype:
# PerfEstimate.floor_time_s) by more than this: faster is physically absent work.
MIN_ESTIMATE_VS_IDEAL = 0.8
# A kernel body whose work (what reaches its outputs, weighed by cost: evaluator/analysis/live_work.py)
# comes mostly from a library's code is the library's kernel.
MAX_LIBRARY_SHARE = 0.5


@dataclass
class Failure:
    """What a stage found wrong. `case` and `vmem` reach the verdict as typed fields."""

    status: Status
    message: str
    error_type: str | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    case: Case | None = None
    vmem: VmemFinding | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a status outside the one list is a bug here


@dataclass
class GradingContext:
    task: Task
    answer: str
    split: str
    backend: Backend
    generation: TpuGeneration
    base_seed: int
    n_seeds: int
    references: ReferenceCache
    verdict: Verdict
    worker: Worker | None = None
    stop_at_first_failure: bool = False  # run stage: skip the remaining cases once one fails
    tpu_numerics: bool = True  # interpret mode: dots in kernels as the TPU's MXU computes them
    seed_checks: str = "auto"  # run stage: where the race detector runs (protocol.SEED_CHECKS)
    limits: Limits = Limits()  # run stage: the base step limit and ceiling of evaluator/execution/step_limits.py
    source: str = ""
    shim: str = ""  # appended when loaded: kernel() for a candidate in a peer suite's format
    summaries: dict[str, TraceSummary] = field(default_factory=dict)
    origins: dict[str, list[KernelOrigin]] = field(default_factory=dict)
    # Primitives around kernels that the interpret-mode replay cannot rebuild yet (any case).
    replay_limits: list[str] = field(default_factory=list)
    # Check cases the coverage stage derived from bench cases (evaluator/analysis/coverage.py): run
    # after the task's own check cases, so every axis tiled at bench sizes runs two blocks.
    coverage_cases: list[Case] = field(default_factory=list)
    # The kernels' least share of the task's FLOPs over the check cases (structure stage): the
    # bench-size work rules judge kernels that do at least INSIDE_FLOPS_SHARE there.
    check_work_share: float = 1.0
    # What the bench program runs that no run case checks (coverage stage: spaces no derived
    # case reaches), in words: such a kernel is `unverified`, not `correct` (verified stage).
    unchecked: list[str] = field(default_factory=list)
    # The speed prediction's XLA side and constants (evaluator/performance/): None prices the
    # reference by our model alone.
    reference_costs: ReferenceCosts | None = None
    calibration: Calibration = Calibration()
    # XLA's cost model of the candidate's program per case, from the lowering stage's libtpu
    # compile: the speed prediction prices the glue around the kernels by it.
    compiled_costs: dict[str, XlaProgramCost] = field(default_factory=dict)

    @property
    def stress_cases(self) -> list[tuple[Case, Case]]:
        """(stress case, the case whose traced program it runs): the task's input regimes at a
        check size (evaluator/truth/stress.py). An imported task declares none."""
        return stress.stress_cases(self.task, self.split) if self.task.external is None else []

    @property
    def traced_cases(self) -> list[Case]:
        """Check and bench sizes of the split, and stress cases at sizes of their own: tracing
        and lowering are cheap at any size."""
        own = [case for case, program in self.stress_cases if program is case]
        return self.task.select(self.split, "check") + own + self.task.select(self.split, "bench")

    @property
    def lowered_cases(self) -> list[Case]:
        """Every size the run stage runs or the bench times: a derived coverage case too, since
        a TPU compiles it before it runs it (a kernel can fail to compile there alone)."""
        return self.traced_cases + self.coverage_cases

    @property
    def run_cases(self) -> list[Case]:
        return self.task.select(self.split, "check") + [c for c, _ in self.stress_cases] + self.coverage_cases

    @property
    def run_plan(self) -> list[tuple[Case, list[int]]]:
        """Each case the run stage runs, with its seeds: the task's check cases and stress cases
        first, so theirs are known before the coverage stage adds its own. The task's own cases
        get n_seeds seeds; a stress or coverage case, there to run a regime or a path the
        others do not, gets one (the values it computes are those the others check on every
        seed)."""
        own = {c.name for c in self.task.select(self.split, "check")}
        return [(case, case_seeds(self.base_seed, index, self.n_seeds if case.name in own else 1))
                for index, case in enumerate(self.run_cases)]

    def program_of(self, case: Case) -> str:
        """The traced case whose program runs `case`: its own, but for a stress case at its
        check case's sizes, which runs that case's (no second trace or compile)."""
        return next((program.name for c, program in self.stress_cases if c.name == case.name), case.name)


def case_spec(task: Task, case: Case, traffic: bool = False) -> CaseSpec:
    """What a worker needs to trace, lower or compile a case: its name, argument specs and the
    bounds of its integer inputs (so data-dependent loops count at their maximum)."""
    first_parameter = task.first_parameter(case) if task.first_parameter is not None else None
    return CaseSpec(case.name, [(list(a.shape), a.dtype) for a in task.arg_specs(case)],
                    task.arg_bounds(case), traffic, first_parameter)


# --- 1. extract ---------------------------------------------------------------------------
def extract_stage(ctx: GradingContext) -> Failure | None:
    try:
        ctx.source = extract_code(ctx.answer, ctx.task.entry_points)
    except ExtractionError as exc:
        return Failure("extraction_error", str(exc))
    if ctx.task.adapt_candidate is not None:  # written in a peer suite's format (suites/)
        try:
            adapted = ctx.task.adapt_candidate(ctx.source)
        except CandidateFormatError as exc:
            return Failure("import_error", f"{exc}.", "NameError", str(exc))
        except (SyntaxError, ValueError):
            return None  # the policy stage reports it
        ctx.source, ctx.shim = adapted.checked, adapted.shim
        if adapted.notes:
            ctx.verdict.details["adapted"] = adapted.notes
    return None


# --- 2. parse + static policy --------------------------------------------------------------
def policy_stage(ctx: GradingContext) -> Failure | None:
    try:
        tree = policy.parse(ctx.source)
    except policy.PolicySyntaxError as exc:
        return Failure("syntax_error", f"the code does not parse: {exc}", "SyntaxError", str(exc))
    found = policy.violations(tree)
    if found:
        listed = "; ".join(str(v) for v in found[:3])
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        return Failure("policy_violation", f"the code breaks the evaluator's rules: {listed}{more}.",
                       details={"violations": [str(v) for v in found]})
    return None


# --- 3. load in the sandbox ------------------------------------------------------------------
def load_stage(ctx: GradingContext) -> Failure | None:
    # Without a TPU, Pallas code that asks which chip it runs on hears the target generation.
    device_kind = None if ctx.backend.device_compile else ctx.generation.device_kind
    reply, _ = ctx.worker.call(Load(ctx.source + ctx.shim, device_kind), what="loading the module")
    if isinstance(reply, Failed):
        return Failure("import_error", f"executing the module failed: {reply.error_type}: "
                                       f"{reply.error}", reply.error_type, reply.error)
    return None


# --- 4. structure: kernels present, heavy work inside them ----------------------------------
def structure_stage(ctx: GradingContext) -> Failure | None:
    cases = ctx.traced_cases
    # Every size gets the traffic analysis (the kernels' FLOPs per grid step): the performance
    # model needs it at bench sizes, and the work rules weigh the kernels' FLOPs against the
    # task's at check sizes (check_work_share) and at bench sizes (_missing_work).
    specs = [case_spec(ctx.task, c, traffic=True) for c in cases]
    reply, _ = ctx.worker.call(Trace(specs), what="tracing kernel()")
    if isinstance(reply, Failed):
        case = next(c for c in cases if c.name == reply.case)
        if not policy.imports_pallas(policy.parse(ctx.source)):
            # Plain JAX that fails to trace (e.g. sizes hard-coded for another case) has the more
            # basic defect: there is no kernel at all.
            return Failure("no_kernel", f"the module never imports jax.experimental.pallas, so it has no "
                           f"Pallas kernel (and tracing kernel() failed at case {case.describe()}: "
                           f"{reply.error_type}: {reply.error}); the computation must be written as a "
                           "Pallas kernel.", reply.error_type, reply.error, case=case)
        return Failure("lowering_error", f"tracing kernel() failed at case {case.describe()}: "
                                         f"{reply.error_type}: {reply.error}",
                       reply.error_type, reply.error, case=case)
    ctx.summaries = {t.case: t.summary for t in reply.cases}
    ctx.origins = {t.case: t.origins for t in reply.cases}
    ctx.replay_limits = sorted({name for t in reply.cases for name in t.replay_limits})
    for case in cases:
        summary = ctx.summaries[case.name]
        out = summary.outside
        if out.callbacks:
            return Failure("work_outside_kernel", f"kernel() calls back to the host "
                           f"({', '.join(sorted(set(out.callbacks)))}) at case {case.name}; all work "
                           "must run on the TPU inside pallas_call kernels.", case=case)
        if not summary.pallas_calls:
            return Failure("no_kernel", f"no pallas_call found when tracing kernel() at case "
                           f"{case.describe()}; the computation must be written as a Pallas kernel.", case=case)
        failure = _origin_failure(ctx.origins[case.name], case)
        if failure is not None:
            return failure
        low = None if ctx.task.external is not None else precision.low_precision_finding(
            summary.pallas_calls, [a.dtype for a in ctx.task.arg_specs(case)], case.name, ctx.task.name)
        if low is not None:
            return Failure("policy_violation", low, details={"low_precision_dots": sorted(
                {d for call in summary.pallas_calls for d in call.low_precision_dots})})
        if out.heavy_ops:
            return Failure("work_outside_kernel", f"{', '.join(sorted(set(out.heavy_ops)))} runs outside "
                           f"any Pallas kernel at case {case.name}; matrix products must happen "
                           "inside pallas_call.", case=case)
        ref_flops = ctx.references.flops(ctx.task, case)
        ctx.verdict.details.setdefault("outside_flops_share", {})[case.name] = (
            out.flops / ref_flops if ref_flops else 0.0)
        if ref_flops and out.flops > OUTSIDE_FLOPS_SHARE * ref_flops:
            top = sorted(out.top_ops.items(), key=lambda kv: -kv[1])[:3]
            ops = ", ".join(f"{name} ({flops / ref_flops:.0%})" for name, flops in top)
            return Failure("work_outside_kernel", f"{out.flops / ref_flops:.0%} of the reference's "
                           f"arithmetic runs outside the Pallas kernels at case {case.name} "
                           f"(mostly {ops}); only glue such as padding, reshapes and casts may run "
                           f"outside (limit {OUTSIDE_FLOPS_SHARE:.0%}).", case=case)
        failure = _intermediate_failure(ctx, summary, case)
        if failure is not None:
            return failure
    return _bench_program_failure(ctx, cases)


def _bench_program_failure(ctx: GradingContext, cases: list[Case]) -> Failure | None:
    """At bench sizes (traced, lowered and timed, never compared on a CPU) the program must be
    the one the check sizes ran (evaluator/analysis/one_program.py), its kernels must do some arithmetic,
    and, where they do at least INSIDE_FLOPS_SHARE of the task's FLOPs at the check sizes, that
    much here too (_missing_work). A shortcut taken only where nobody compares is refused
    whatever its FLOPs; an exact rewrite that does less work at every size is not."""
    checks = [c for c in cases if c.size == "check"]
    shares = {c.name: _work_share(ctx, c) for c in cases}
    ctx.verdict.details["work_share"] = {name: share for name, share in shares.items() if share is not None}
    check_share = ctx.check_work_share = min((shares[c.name] for c in checks if shares[c.name] is not None),
                                             default=1.0)
    for case in (c for c in cases if c.size == "bench"):
        summary = ctx.summaries[case.name]
        why = one_program.shortcut(summary, [(c.name, ctx.summaries[c.name]) for c in checks])
        if why is not None:
            return Failure("work_outside_kernel", f"at bench case {case.describe()} {why}; kernel() must "
                           "be one program at every size (the same kernels, computing the same things, as "
                           "at the check sizes), so that what is timed is what was checked.", case=case)
        ref_flops = ctx.references.flops(ctx.task, case) * ctx.task.necessary_flops_share
        if ref_flops:
            failure = _missing_work(summary, ref_flops, case, check_share, ctx.task.work_slack)
            if failure is not None:
                return failure
    return None


def _work_share(ctx: GradingContext, case: Case) -> float | None:
    """The kernels' FLOPs over the FLOPs the task needs at a case (None where it needs none)."""
    needed = ctx.references.flops(ctx.task, case) * ctx.task.necessary_flops_share
    return ctx.summaries[case.name].kernel_flops / needed if needed else None


def _intermediate_failure(ctx: GradingContext, summary: TraceSummary, case: Case) -> Failure | None:
    """A tensor kept in HBM between kernels, or exp/log/reductions outside kernels, over more
    than INTERMEDIATE_LIMIT x the case's inputs and outputs (evaluator/analysis/intermediates.py): the
    FLOP share misses attention's softmax left to XLA over the [B, H, S, S] logits."""
    arrays = [(tuple(a.shape), a.dtype) for a in (*ctx.task.arg_specs(case), *ctx.task.out_specs(case))]
    weighed = intermediates.weigh(summary.intermediates, summary.outside_math, arrays, case.describe())
    ctx.verdict.details.setdefault("intermediate_ratio", {})[case.name] = weighed.ratio
    if weighed.message is None:
        return None
    return Failure("work_outside_kernel", weighed.message, details=weighed.details)


def _origin_failure(origins: list[KernelOrigin], case: Case) -> Failure | None:
    """The kernels must be the candidate's, and run the way the evaluator chooses."""
    for origin in origins:
        if origin.interpret:
            return Failure("policy_violation", f"pallas_call {origin.name} at case {case.name} was "
                           f"traced with interpret={origin.interpret}; the evaluator chooses how "
                           "kernels run, so leave interpret at its default (False).", case=case)
    for origin in origins:
        if origin.defined_in != "candidate":
            return Failure("policy_violation", f"the kernel {origin.name} of a pallas_call at case "
                           f"{case.name} is defined in {origin.defined_in}, a library, not in your "
                           "code; the task asks for a kernel you write: define the kernel body "
                           "(the function passed to pallas_call) yourself.",
                           details={"library_kernel": origin.defined_in}, case=case)
        if origin.library_share > MAX_LIBRARY_SHARE:
            return Failure("policy_violation", f"the body of kernel {origin.name} at case {case.name} "
                           f"does its work by calling library code ({origin.library_share:.0%} of the "
                           f"work that reaches its outputs comes from {origin.main_library}); the task "
                           "asks for a kernel you write: compute in the kernel body yourself.",
                           details={"library_kernel": origin.main_library}, case=case)
    return None


def _missing_work(summary: TraceSummary, ref_flops: float, case: Case, check_share: float = 1.0,
                  slack: float = 0.05) -> Failure | None:
    """At a bench size the kernels must do some arithmetic, and, when they do at least
    INSIDE_FLOPS_SHARE of the task's FLOPs at the check sizes (`check_share`, their least share
    there: a kernel that does the task's work where it is compared), as large a share here, up
    to all of it, less the task's `slack`: one that skips its last blocks, or stops a loop early,
    only at sizes nobody compares does less here than where it is checked. A kernel that does
    less at the check sizes, and is right there, computes the task another way (an exact
    rewrite, `sum(x @ W, 1)` as `x @ W.sum(0)`): the floor cannot judge it, the one-program rule
    does. `ref_flops`: the FLOPs the task needs (the reference's, times Task.necessary_flops_share)."""
    inside = summary.kernel_flops
    expected = (1.0 - slack) * min(check_share, 1.0) if check_share >= INSIDE_FLOPS_SHARE else 0.0
    if inside > 0 and inside >= expected * ref_flops:
        return None
    calls = summary.pallas_calls
    if any(c.undecided_trips for c in calls) and not any(c.unbounded_trips_from for c in calls):
        return None  # a loop or grid the task's integer inputs size: a lower bound, undecided
    return Failure("work_outside_kernel", f"at case {case.describe()} the Pallas kernels perform "
                   f"{inside / 1e9:.3g} GFLOP, {inside / ref_flops:.0%} of the task's "
                   f"{ref_flops / 1e9:.3g} GFLOP (at least {expected:.0%} expected, and some arithmetic: "
                   f"at the check sizes they perform {min(check_share, 9.99):.0%} of it); the "
                   "kernel must compute the whole task at every size, not only at small ones: no block "
                   "skipped and no loop cut short where the sizes are large"
                   f"{_counted_once([(c.name, c.unbounded_trips_from) for c in calls])}.",
                   details={"inside_flops": inside, "reference_flops": ref_flops, "check_share": check_share},
                   case=case)


def _counted_once(kernels: list[tuple[str, str]]) -> str:
    """A clause naming the kernels whose loop or grid length depends on something other
    than the task's integer inputs (evaluator/analysis/trip_origin.py) and so counted once."""
    named = [f"kernel {name} has a loop or grid whose length depends on {source}, counted once"
             for name, source in kernels if source]
    if not named:
        return ""
    return f"; {'; '.join(named)}: take trip counts from shapes, the grid or the task's integer inputs"


# --- 4a. index maps: evaluated over the whole grid at bench sizes ------------------------------------
def index_maps_stage(ctx: GradingContext) -> Failure | None:
    """Bench sizes are traced but never run here, and a check case often fits in one block per
    axis: the worker evaluated every index map over the whole grid (evaluator/analysis/grid_checks.py).
    A block outside its array, an output block never written, or a kernel() argument not read
    in full at a bench size is refused. Check sizes are run, where interpret mode sees these."""
    unchecked: dict[str, dict[str, list[str]]] = {}
    for case in ctx.task.select(ctx.split, "bench"):
        for call in ctx.summaries[case.name].pallas_calls:
            if call.grid_unchecked:
                unchecked.setdefault(case.name, {})[call.name] = call.grid_unchecked
            for finding in call.grid_findings:
                status, message, error_type = grid_checks.refusal(finding, call.name, case.describe())
                return Failure(status, message, error_type, message,
                               details={"grid_finding": dataclasses.asdict(finding)}, case=case)
    if unchecked:
        ctx.verdict.details["grid_unchecked"] = unchecked
    return None


# --- 4b. coverage: every axis tiled at bench sizes runs two blocks at some check case ---------
def coverage_stage(ctx: GradingContext) -> Failure | None:
    """Derive check cases for the grid axes and in-kernel loops that bench sizes iterate more
    than the check sizes do (evaluator/analysis/coverage.py); the run stage runs them like the
    task's own. Never fails by itself: a gap no derived case closes (kernel() does not trace
    there, the task cannot make inputs there, over the size budget) is listed in
    details["coverage"]["uncovered"], with why, and makes the kernel `unverified` at the end."""
    task, split = ctx.task, ctx.split
    checks, benches = task.select(split, "check"), task.select(split, "bench")
    gaps = coverage.axis_gaps([(c.dtype, ctx.summaries[c.name]) for c in checks],
                              [(b, ctx.summaries[b.name]) for b in benches])
    plan = coverage.CoveragePlan(gaps=gaps)
    # Derived sizes are bounded by the task's largest check case: the bound is on a grading's
    # cost, which the split does not change (held-out's check sizes are small on purpose, and
    # bounds from theirs left topk's solution unverified there).
    largest = max(coverage.elements(task, c) for c in task.select("all", "check"))
    for bench in benches:
        mine = [g for g in gaps if g.bench == bench.name]
        if not mine:
            continue
        if task.external is not None:
            # An imported task's sources are rewritten per declared size (suites/): it has no
            # other sizes to derive.
            plan.uncovered += [f"{g.describe()}: an imported task has no sizes but its own" for g in mine]
            continue
        skipped: list[str] = []
        try:
            left = _cover(ctx, plan, bench, mine, largest, skipped)
        except ValueError as exc:  # a size the task refuses (its arg_specs' own check), found planning
            skipped.append(f"the task refuses a derived size: {exc}")
            left = mine
        why = f" ({'; '.join(skipped)})" if skipped else ""
        plan.uncovered += [f"{g.describe()}: {g.unrun()}{why}" for g in left]
    plan.prune(ctx.summaries)
    ctx.coverage_cases = plan.cases
    ctx.verdict.details["coverage"] = plan.to_details(coverage.steps_table(ctx.summaries, ctx.run_cases))
    if task.external is None:  # an imported task's are named in details, and said (correct_message)
        ctx.unchecked += plan.uncovered
    return None


def _cover(ctx: GradingContext, plan: coverage.CoveragePlan, bench: Case, gaps: list[coverage.AxisGap],
           largest: int, skipped: list[str]) -> list[coverage.AxisGap]:
    """Derive the cases that run `gaps` (those of one bench case) their needed steps, add them to
    the plan, and return the gaps none runs. First each gap's dimension grown to a few blocks
    (probes, one dimension at a time at its bench value, show which); then, for what that left,
    the probe itself (steps that do not follow the dimension in proportion, a branch only the
    bench value takes), or the probe less half a block where that leaves a ragged tail; then
    every dimension but one at its bench value (a space several dimensions drive), within a
    larger budget. Budgets are in multiples of `largest`, the elements of the task's largest
    check case."""
    task, budget = ctx.task, coverage.MAX_ELEMENTS_FACTOR * largest
    base = coverage.base_case(task, ctx.split, bench)
    if base.name not in ctx.summaries:  # a check case in the bench case's dtype and params
        ctx.summaries.update(_trace_where_possible(ctx, [base]))
    if base.name not in ctx.summaries:
        skipped.append(f"kernel() does not trace at {base.describe()}")
        return gaps
    single = _traced_probes(ctx, coverage.probe_cases(base, bench))
    sizes = coverage.choose_sizes(task, base, bench, gaps, ctx.summaries[base.name],
                                  {dim: summary for dim, (_, summary) in single.items()})
    cases, why = coverage.plan_cases(task, base, bench, sizes, budget)
    skipped += why
    derived = _derive(ctx, plan, bench, cases, skipped)
    left = coverage.still_uncovered(gaps, list(derived.values()))
    if left:
        single.update(_traced_probes(ctx, coverage.ragged_probes(task, left, single)))
        cases, _ = coverage.cases_from_probes(task, bench, left, single, budget)
        derived.update(_derive(ctx, plan, bench, cases, skipped))
        left = coverage.still_uncovered(gaps, list(derived.values()))
    if left:
        joint = _traced_probes(ctx, coverage.joint_probes(base, bench))
        cases, _ = coverage.cases_from_probes(task, bench, left, joint, coverage.JOINT_ELEMENTS_FACTOR * largest)
        derived.update(_derive(ctx, plan, bench, cases, skipped))
        left = coverage.still_uncovered(gaps, list(derived.values()))
    return left


def _traced_probes(ctx: GradingContext, probes: dict[str, Case]) -> dict[str, tuple[Case, TraceSummary]]:
    """dim -> (probe, its traced summary), for the probes kernel() traces at."""
    traced = _trace_where_possible(ctx, list(probes.values()))
    return {dim: (probe, traced[probe.name]) for dim, probe in probes.items() if probe.name in traced}


def _derive(ctx: GradingContext, plan: coverage.CoveragePlan, bench: Case, cases: list[Case],
            skipped: list[str]) -> dict[str, TraceSummary]:
    """Trace derived cases and add those the task can make inputs at and kernel() traces at to
    the plan (and the run); the others go to `skipped`, said in words."""
    cases = [c for c in cases if c.name not in plan.derived_from]
    problems = {c.name: coverage.inputs_problem(ctx.task, c) for c in cases}
    skipped += [why for why in problems.values() if why]
    cases = [c for c in cases if not problems[c.name]]
    derived = _trace_where_possible(ctx, cases)
    for case in cases:
        if case.name in derived:
            plan.add(case, bench, derived[case.name])
            ctx.summaries[case.name] = derived[case.name]
        else:
            skipped.append(f"kernel() does not trace at {case.describe()}")
    return derived


def _trace_where_possible(ctx: GradingContext, cases: list[Case]) -> dict[str, TraceSummary]:
    """Trace `cases` in the worker (kept there for the run stage); a case kernel() does not
    trace at is dropped, not a failure: it is a size the grader chose, not one the task asks.
    details["coverage_traces"] counts the calls of kernel() it makes."""
    out: dict[str, TraceSummary] = {}
    todo = list(cases)
    calls = 0
    while todo:
        reply, _ = ctx.worker.call(Trace([case_spec(ctx.task, c, traffic=True) for c in todo]),
                                   what="tracing kernel() at coverage sizes")
        if not isinstance(reply, Failed):
            out.update({t.case: t.summary for t in reply.cases})
            calls += len(todo)
            break
        # Trace stops at the first case that fails: drop it and trace the others again.
        calls += 1 + [c.name for c in todo].index(reply.case)
        todo = [c for c in todo if c.name != reply.case]
    ctx.verdict.details["coverage_traces"] = ctx.verdict.details.get("coverage_traces", 0) + calls
    return out


# --- 5. required TPU features ------------------------------------------------------------------
def features_stage(ctx: GradingContext) -> Failure | None:
    """Every required feature used (not only declared) at every case by the kernels that carry
    most of its work; the rules are in evaluator/analysis/features.py. What was found goes into
    details["features"]."""
    if not ctx.task.required_features:
        return None
    found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    ctx.verdict.details["features"] = found
    for case in ctx.traced_cases:
        calls = ctx.summaries[case.name].pallas_calls
        inputs = list(ctx.task.arg_specs(case))
        for name in ctx.task.required_features:
            evidence, why = feature_checks.check_feature(name, calls, case.size == "bench", inputs)
            found.setdefault(name, {})[case.name] = [e.facts for e in evidence]
            if why is None:
                continue
            who = ("the kernels doing the work do not use it" if any(e.used for e in evidence)
                   else "no kernel uses it")
            return Failure("missing_feature", f"task {ctx.task.name} requires {name}, but {who} "
                           f"at case {case.describe()}: {why}. To use it, "
                           f"{feature_checks.how_to_use(name)}.", case=case)
    return None


# --- 6. lowering (Pallas -> Mosaic) and compilation for TPU ---------------------------------
def lowering_stage(ctx: GradingContext) -> Failure | None:
    cases = ctx.lowered_cases
    reply, _ = ctx.worker.call(Lower([case_spec(ctx.task, c) for c in cases],
                                     compile=ctx.backend.device_compile),
                               what="lowering kernel() for TPU")
    if isinstance(reply, Failed):
        case = next(c for c in cases if c.name == reply.case)
        status = "compile_error" if reply.phase == "compile" else "lowering_error"
        return Failure(status, f"{reply.phase} for TPU failed at case {case.describe()}: "
                               f"{reply.error_type}: {reply.error}", reply.error_type, reply.error, case=case)
    if ctx.backend.device_compile:
        return None  # the real compiler has spoken; no need for the model
    # The model first: it is instant, and libtpu can take minutes to reject a huge request.
    failure = _vmem_check(ctx, cases)
    if failure is None and ctx.backend.topology_compile:
        failure = _topology_compile(ctx, cases)
    return failure


def _topology_compile(ctx: GradingContext, cases: list[Case]) -> Failure | None:
    """libtpu compile for the target generation, one case per request (own time limit)."""
    for case in cases:
        reply = _compile_case(ctx, case)
        if isinstance(reply, Failed):
            return Failure("compile_error", f"the TPU compiler for {ctx.generation.name} rejected case "
                           f"{case.describe()}: {reply.error}", reply.error_type, reply.error, case=case)
    return None


def _compile_case(ctx: GradingContext, case: Case) -> Any:
    """One case compiled by libtpu for the generation: its memory statistics and XLA's cost of
    the program are kept; the reply (Compiled or Failed) is returned."""
    gen = ctx.generation
    reply, _ = ctx.worker.call(Compile(gen.topology, case_spec(ctx.task, case)),
                               timeout_s=ctx.worker.limits.compile_timeout_s,
                               what=f"compiling case {case.name} for TPU {gen.name}")
    if not isinstance(reply, Failed):
        ctx.verdict.details.setdefault("compiled_memory", {})[case.name] = reply.memory
        if reply.cost is not None:
            ctx.compiled_costs[case.name] = XlaProgramCost(**reply.cost)
    return reply


def _vmem_check(ctx: GradingContext, cases: list[Case]) -> Failure | None:
    """Without a TPU compiler: refuse kernels whose buffers alone overflow VMEM."""
    usage = ctx.verdict.details.setdefault("vmem_lower_bound_bytes", {})
    gen = ctx.generation
    for case in cases:
        for call in ctx.summaries[case.name].pallas_calls:
            need = vmem_lower_bound(call)
            limit, source = vmem_budget(call, gen)
            usage[case.name] = max(usage.get(case.name, 0), need)
            too_big = bool(call.vmem_limit_bytes) and call.vmem_limit_bytes > gen.vmem_bytes
            if not (need > limit or too_big):
                continue
            finding = VmemFinding(call.name, case.name, need, limit, source, call.vmem_limit_bytes or None,
                                  gen.vmem_bytes, [BlockFigure(b.role, list(b.block_shape), b.dtype, buffers(call, b))
                                                   for b in pipelined_blocks(call)])
            blocks = ", ".join(f"{b.role} {tuple(b.shape)} {b.dtype} x{b.buffers}" for b in finding.blocks)
            what = (f"asks for vmem_limit_bytes={call.vmem_limit_bytes}, more than the "
                    f"{gen.vmem_bytes // MiB} MiB of VMEM on {gen.name}"
                    if too_big else
                    f"needs at least {need / MiB:.1f} MiB of VMEM for its pipelined blocks and "
                    f"scratch ({blocks}), over {source}")
            return Failure("compile_error", f"kernel {call.name} at case {case.describe()} {what}; "
                           "a TPU compiler would reject it (use smaller blocks).",
                           "VmemOverflow", f"{need} > {limit}", case=case, vmem=finding)
    return None


# --- 6b. static performance estimate ----------------------------------------------------------
def estimate_stage(ctx: GradingContext) -> Failure | None:
    """Roofline estimate at bench sizes vs an ideal kernel: useful with or without a TPU, and
    a kernel estimated well under the ideal cannot be doing the task there. The speed
    prediction against XLA (`predicted_speedup`) is made here too, for every kernel that lowers."""
    bench = bench_estimates(ctx)
    estimates = {name: dataclasses.asdict(est) for name, est in bench.items()}
    if bench:
        ctx.verdict.details["perf_estimate"] = next(iter(bench.values())).summary()
    ctx.verdict.details["perf_model"] = estimates
    predict(ctx, bench)
    for name, est in estimates.items():
        kernels = est["kernels"]
        # Undecided: a loop or grid the task's integer inputs size (evaluator/analysis/trip_origin.py).
        lower_bound = (any(k["data_dependent_trips"] for k in kernels)
                       and not any(k["unbounded_trips_from"] for k in kernels))
        vs_floor = est["time_s"] / est["floor_time_s"] if est["floor_time_s"] else float("inf")
        # Only for kernels that do the task's work at the check sizes (as _missing_work): a
        # rewrite that needs less arithmetic is faster than the reference's ideal everywhere.
        judged = ctx.check_work_share >= INSIDE_FLOPS_SHARE
        if judged and vs_floor < MIN_ESTIMATE_VS_IDEAL and not lower_bound:
            case = next(c for c in ctx.task.cases if c.name == name)
            return Failure("work_outside_kernel", f"at case {case.describe()} the kernels' static "
                           f"estimate is {vs_floor:.2f}x the time of an ideal kernel "
                           "that reads every input once, writes every output once and does the "
                           "task's arithmetic at the bf16 peak: less work than the task needs. The kernel must "
                           "compute the whole task at every size"
                           f"{_counted_once([(k['name'], k['unbounded_trips_from']) for k in kernels])}.", case=case)
    return None


def bench_estimates(ctx: GradingContext) -> dict[str, perf_model.PerfEstimate]:
    """The static model at each bench case the structure stage traced."""
    out = {}
    for case in ctx.task.select(ctx.split, "bench"):
        if case.name in ctx.summaries:
            out[case.name] = perf_model.estimate(
                case.name, ctx.summaries[case.name], ctx.generation, ctx.references.cost(ctx.task, case),
                list(ctx.task.arg_specs(case)), list(ctx.task.out_specs(case)), ctx.task.necessary_flops_share)
    return out


def predict(ctx: GradingContext, estimates: dict[str, perf_model.PerfEstimate]) -> None:
    """`predicted_speedup`: our model's time for the kernels and their glue at each bench case
    against XLA's cost model's time for the reference (our model's where libtpu is absent or
    XLA's figure is unusable, as the notes say). None unless every bench case was traced."""
    bench = ctx.task.select(ctx.split, "bench")
    if not bench or any(case.name not in estimates for case in bench):
        return
    cases = {}
    for case in bench:
        xla = (ctx.reference_costs.cost(ctx.task, case, case_spec(ctx.task, case), ctx.generation)
               if ctx.reference_costs is not None else "the grader was given no XLA cost source")
        inputs = prediction.CaseInputs.of(estimates[case.name], ctx.references.cost(ctx.task, case), xla,
                                          ctx.compiled_costs.get(case.name))
        cases[case.name] = prediction.predict_case(inputs, ctx.generation, ctx.calibration)
    ctx.verdict.predicted_speedup = dataclasses.asdict(prediction.overall(cases, ctx.generation))


def predict_failed(ctx: GradingContext) -> None:
    """The speed prediction of a candidate a stage refused after tracing (`estimate` lists every
    kernel that traces). A compiling backend first compiles the bench cases the lowering stage
    did not reach, so XLA prices its glue as it would a passing kernel's; a compile that fails
    or kills the worker leaves our count of the glue."""
    if ctx.backend.topology_compile and ctx.worker is not None:
        for case in ctx.task.select(ctx.split, "bench"):
            if case.name not in ctx.summaries or case.name in ctx.compiled_costs or not ctx.worker.alive:
                continue
            try:
                _compile_case(ctx, case)
            except WorkerError:
                break
    predict(ctx, bench_estimates(ctx))


# --- 7. run every case on fresh seeds and compare --------------------------------------------
def run_stage(ctx: GradingContext) -> Failure | None:
    if ctx.backend.interpret and ctx.replay_limits:
        return _replay_limit_failure(ctx)
    plan = ctx.run_plan
    # The host works beside the worker (on two cores that hides most of its part,
    # benchmarks/grading_profile.py): it makes every expected output and the next case's
    # inputs while the worker runs a case, and compares a case's outputs while the worker runs
    # the next one, unless the grading stops at a first failure, which must be known first.
    judged: list[tuple[CaseResult, Future | Failure | None]] = []
    try:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="host") as host:
            for index, (case, seeds) in enumerate(plan):
                result = CaseResult(case.name, case.split, dict(case.dims), case.dtype, dict(case.params))
                ctx.verdict.cases.append(result)
                result.seeds = seeds
                judge, crashed = _run_case(ctx, case, result, host,
                                           plan[index + 1] if index + 1 < len(plan) else None)
                if not (crashed or ctx.stop_at_first_failure):
                    judged.append((result, host.submit(judge)))
                    continue
                failure = judge()
                judged.append((result, failure))
                if failure is not None:
                    break  # a crash may have taken the worker: more cases would only repeat the fault
    finally:  # cases judged before a worker timeout keep their own status
        failures = []
        for result, outcome in judged:
            failure = outcome.result() if isinstance(outcome, Future) else outcome
            result.status = "correct" if failure is None else failure.status
            if failure is not None:
                failures.append((result, failure))
    if not failures:
        return None
    first_result, first = failures[0]
    ran = [c for c in ctx.verdict.cases if c.status != "pending"]
    passed = [c.name for c in ran if c.status == "correct"]
    summary = f" {len(failures)} of {len(ran)} cases failed"
    summary += f" (passed: {', '.join(passed[:4])}{'...' if len(passed) > 4 else ''})." if passed else "."
    first.message += (summary + coverage.failure_note(ctx.verdict.details.get("coverage"), first_result.name)
                      + (stress.describe(ctx.task, first.case) if first.case is not None else ""))
    return first


def _replay_limit_failure(ctx: GradingContext) -> Failure:
    """The grader's own limit (evaluator/execution/program.py, ReplayLimit): the kernel passed every
    check so far, but this backend cannot run it, so nothing is said against the kernel."""
    where = " or ".join(repr(name) for name in ctx.replay_limits)
    return Failure("grader_limit", f"this grader cannot run the kernel on {ctx.backend.name} yet: its "
                   f"TPU interpret mode cannot replay a pallas_call inside {where}. That is the "
                   "grader's limit, not an error in your kernel, which passed every check before the "
                   "run (the TPU lowering included). To be graded here, call the pallas_call outside "
                   f"{where} (jit, scan, while_loop, cond and shard_map are replayed); on a TPU "
                   "(--backend tpu) it runs as traced.",
                   "ReplayLimit", f"a pallas_call inside {where} cannot be replayed in interpret mode",
                   details={"replay_limits": list(ctx.replay_limits)})


def _run_case(ctx: GradingContext, case: Case, result: CaseResult, host: ThreadPoolExecutor,
              upcoming: tuple[Case, list[int]] | None) -> tuple[Callable[[], Failure | None], bool]:
    """Run one case's seeds in the worker (the host makes their expected outputs meanwhile);
    returns the judgement to make of its outputs, and whether a seed crashed."""
    task, refs = ctx.task, ctx.references
    start = time.perf_counter()
    inputs_per_seed = [refs.inputs(task, case, s) for s in result.seeds]
    arrays = [a for inputs in inputs_per_seed for a in inputs]
    made_s = time.perf_counter() - start

    def expected_outputs() -> list[tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None] | None]]:
        begin = time.perf_counter()
        out = [(refs.outputs_for(task, case, s), refs.tpu_outputs_for(task, case, s),
                refs.sensitivity_for(task, case, s)) for s in result.seeds]
        for s in upcoming[1] if upcoming else ():
            refs.tpu_outputs_for(task, upcoming[0], s)  # the next case's inputs and outputs, ahead
        result.reference_s = made_s + time.perf_counter() - begin
        return out

    expected = host.submit(expected_outputs)
    program = ctx.program_of(case)
    summary = ctx.summaries.get(program)
    races = summary is None or summary.races_possible
    limit = step_limits.run_limit(summary, len(result.seeds),
                                  ctx.limits.step_timeout_s, ctx.limits.run_ceiling_s)
    result.limit_s = limit.seconds
    request = Run(program, len(inputs_per_seed[0]), ctx.tpu_numerics, ctx.seed_checks, races)
    reply, outputs = ctx.worker.call(request, arrays, timeout_s=limit.seconds,
                                     what=f"running case {case.name} (its limit: {limit.describe()})")
    result.compile_s = reply.compile_s
    result.seed_run_s = [r.seconds for r in reply.results if r.ok]
    result.seed_checks = [r.checks for r in reply.results]
    result.run_s = reply.compile_s + sum(result.seed_run_s)

    def judge() -> Failure | None:
        expected_per_seed = expected.result()
        begin = time.perf_counter()
        try:
            return _compare_case(ctx, case, result, reply, outputs, expected_per_seed)
        finally:
            result.compare_s = time.perf_counter() - begin

    return judge, not all(r.ok for r in reply.results)


def _compare_case(ctx: GradingContext, case: Case, result: CaseResult, reply: Ran, outputs: list[np.ndarray],
                  expected_per_seed: list[tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None] | None]]
                  ) -> Failure | None:
    task = ctx.task
    expected = list(task.out_specs(case))
    offset = 0
    worst = None  # (comparison, seed, output index, out, ref): the failing one, else the largest error
    result.bound_ratio = 0.0
    for seed, seed_result, (expected_out, tpu_out, spread) in zip(result.seeds, reply.results, expected_per_seed):
        if not seed_result.ok:
            result.error = f"{seed_result.error_type}: {seed_result.error.rstrip('.')}"
            if seed_result.error_type == INTERPRETER_FAULT:
                return Failure("grader_limit", f"this grader cannot run the kernel on {ctx.backend.name} yet: "
                                               f"jax's TPU interpret mode failed inside its own code on case "
                                               f"{case.describe()} ({seed_result.error.rstrip('.')}). That is "
                                               "the grader's limit, not an error in your kernel, which passed "
                                               "every check before the run (the TPU lowering included); on a "
                                               "TPU (--backend tpu) it runs as traced.",
                               seed_result.error_type, seed_result.error, case=case)
            return Failure("runtime_error", f"runtime error on case {case.describe()}, seed {seed}: "
                                            f"{result.error}.", seed_result.error_type, seed_result.error, case=case)
        got = outputs[offset: offset + seed_result.n_outputs]
        offset += seed_result.n_outputs
        shape_problem = _shape_problem(got, expected, seed_result)
        if shape_problem:
            result.error = shape_problem
            return Failure("wrong_shape", f"wrong output structure on case {case.describe()}: "
                                          f"{shape_problem}.", case=case)
        for i, (out, ref, tpu_ref) in enumerate(zip(got, expected_out, tpu_out)):
            cmp = compare(out, ref, task.tolerances[case.dtype], tpu_ref, spread[i] if spread else None)
            result.bound_ratio = max(result.bound_ratio, cmp.bound_ratio)
            if worst is None or not cmp.ok or cmp.rel_l2_err > worst[0].rel_l2_err:
                worst = (cmp, seed, i, out, ref)
            if not cmp.ok:
                break
        if not worst[0].ok:
            break
    cmp, seed, i, out, ref = worst
    result.max_abs_err, result.max_rel_err = cmp.max_abs_err, cmp.max_rel_err
    result.rel_l2_err, result.mismatch_fraction = cmp.rel_l2_err, cmp.mismatch_fraction
    result.worst_index = cmp.worst_index
    if cmp.ok:
        return None
    where = tuple(cmp.worst_index)
    which = f"output {i} " if len(expected) > 1 else ""
    result.error = cmp.reason
    return Failure("wrong_output", f"wrong values on case {case.describe()}, seed {seed}: {which}"
                   f"{cmp.reason}; max abs error {cmp.max_abs_err:.3g}, worst at index {list(where)} "
                   f"(expected {float(ref[where]):.4g}, got {float(np.asarray(out[where], np.float64)):.4g}).",
                   case=case)


def _shape_problem(got: list[np.ndarray], expected: list, seed_result: SeedResult) -> str:
    if seed_result.non_arrays:
        return f"kernel() returned non-array values ({', '.join(seed_result.non_arrays)})"
    if len(got) != len(expected):
        return f"expected {len(expected)} output array(s), got {len(got)} ({seed_result.tree})"
    for i, (out, spec) in enumerate(zip(got, expected)):
        label = f"output {i}" if len(expected) > 1 else "the output"
        if tuple(out.shape) != tuple(spec.shape):
            return f"{label} has shape {tuple(out.shape)}, expected {tuple(spec.shape)}"
        if out.dtype.name != spec.dtype:
            return f"{label} has dtype {out.dtype.name}, expected {spec.dtype}"
    return ""


# --- 8. timing against XLA, on real hardware only ----------------------------------------------
def timing_stage(ctx: GradingContext) -> Failure | None:
    """Median wall time of the kernel and of the XLA reference at the bench sizes, on the same
    inputs; the kernel's outputs of the timed runs are checked too: a speedup only counts for
    a kernel that is right at the size it was timed at."""
    if not ctx.backend.times_kernels:
        return None
    bench = ctx.task.select(ctx.split, "bench") or ctx.run_cases
    samples: dict[str, Any] = {}
    ratios = []
    for case in bench:
        # Bench-size arrays are large: made here for this case alone, never cached.
        request = Time(ctx.task.name, case.name, warmup=3, iters=20, tpu_numerics=ctx.tpu_numerics)
        if ctx.task.external is not None:  # their reference, built in the worker by our driver
            inputs, _ = ctx.task.external.sample(case, ctx.base_seed)
            request.reference_source, request.reference_function, request.reference_args = (
                ctx.task.external.timing_reference(case))
        else:
            inputs = ctx.task.make_inputs(case, np.random.default_rng(ctx.base_seed))
        reply, outputs = ctx.worker.call(request, list(inputs), what=f"timing case {case.name}")
        if isinstance(reply, Failed):
            return Failure("runtime_error", f"timing case {case.describe()} failed: "
                           f"{reply.error_type}: {reply.error}", reply.error_type, reply.error, case=case)
        failure = _timed_output_failure(ctx, case, outputs, ctx.references.outputs(ctx.task, case, inputs),
                                        ctx.references.outputs(ctx.task, case, inputs, tpu_dots=True))
        if failure is not None:
            return failure
        samples[case.name] = {"kernel_s": reply.kernel_s, "reference_s": reply.reference_s}
        ratios.append(statistics.median(reply.reference_s) / statistics.median(reply.kernel_s))
    ctx.verdict.timings = samples
    ctx.verdict.speedup = statistics.median(ratios) if ratios else None
    return None


def _timed_output_failure(ctx: GradingContext, case: Case, outputs: list[np.ndarray],
                          expected: list[np.ndarray], tpu_expected: list[np.ndarray]) -> Failure | None:
    if len(outputs) != len(expected):
        return Failure("wrong_shape", f"at the timed case {case.describe()} kernel() returned "
                                      f"{len(outputs)} output(s), expected {len(expected)}.", case=case)
    for i, (out, ref, tpu_ref) in enumerate(zip(outputs, expected, tpu_expected)):
        if tuple(out.shape) != tuple(ref.shape):
            return Failure("wrong_shape", f"at the timed case {case.describe()} output {i} has "
                                          f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}.", case=case)
        cmp = compare(out, ref, ctx.task.tolerances[case.dtype], tpu_ref)
        if not cmp.ok:
            return Failure("wrong_output", f"wrong values at the timed case {case.describe()}: "
                           f"{cmp.reason}; the kernel must be correct at every size it runs at, "
                           "not only where it is checked.", case=case)
    return None


# --- 9. verified: nothing the bench program runs went unchecked ---------------------------------
def verified_stage(ctx: GradingContext) -> Failure | None:
    """Every case passed; a kernel is `correct` only if they reached every path the bench
    program takes. What they could not reach (a grid axis or loop no derived case runs its
    needed steps, a branch none takes, and why) makes it `unverified`, named: the grader's
    limit and no fault of the kernel's, but no proof of its correctness either. On a TPU the
    timing stage compared the bench sizes themselves, so nothing is left unchecked there."""
    if not ctx.unchecked or ctx.backend.times_kernels:
        return None
    listed = "; ".join(ctx.unchecked[:3]) + (f" (and {len(ctx.unchecked) - 3} more)" if len(ctx.unchecked) > 3 else "")
    return Failure("unverified", f"every case passed, but the check cases could not reach part of what "
                   f"the bench program runs: {listed}. A wrong result there would go unseen, so the kernel "
                   "is not graded correct. Blocks and loops whose step counts follow one dimension at a "
                   "time (not several at once, nor a VMEM budget) let small cases run several steps.",
                   details={"unchecked": list(ctx.unchecked)})


@dataclass(frozen=True)
class Stage:
    """One stage: its name (the verdict's `stage`), its function, and the context fields it
    reads that an earlier stage writes, and those it writes. `check_order` holds every read to
    an earlier write, once, at import; tests/test_stage_order.py holds the declarations to the code."""

    name: str
    run: Callable[[GradingContext], "Failure | None"]
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()


def _stage(name: str, run: Callable[[GradingContext], "Failure | None"], reads: str = "", writes: str = "") -> Stage:
    return Stage(name, run, frozenset(reads.split()), frozenset(writes.split()))


# The evaluator, top to bottom; the first failure decides the verdict.
STAGES: tuple[Stage, ...] = (
    _stage("extract", extract_stage, writes="source shim"),
    _stage("policy", policy_stage, reads="source"),
    _stage("load", load_stage, reads="source shim"),
    _stage("structure", structure_stage, reads="source",
           writes="summaries origins replay_limits check_work_share"),
    _stage("index_maps", index_maps_stage, reads="summaries"),
    _stage("coverage", coverage_stage, reads="summaries", writes="summaries coverage_cases unchecked"),
    _stage("features", features_stage, reads="summaries"),
    _stage("lowering", lowering_stage, reads="summaries coverage_cases"),
    _stage("estimate", estimate_stage, reads="summaries check_work_share"),
    _stage("run", run_stage, reads="summaries replay_limits coverage_cases"),
    _stage("timing", timing_stage, reads="coverage_cases"),
    _stage("verified", verified_stage, reads="unchecked"),
)
STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)
# How far a grading got: a failure at a later stage means the kernel passed more of them.
STAGE_ORDER: dict[str, int] = {name: i for i, name in enumerate(STAGE_NAMES)}
# Stages that read only the source text; every later stage gets a worker process.
SOURCE_STAGES = frozenset({"extract", "policy"})
# The last stage that runs nothing: grading `through` it judges a kernel without executing it.
LAST_STATIC_STAGE = STAGE_NAMES[STAGE_NAMES.index("run") - 1]


def check_order(stages: tuple[Stage, ...]) -> None:
    """Every field a stage reads is written by an earlier one, and only context fields are named."""
    fields = {f.name for f in dataclasses.fields(GradingContext)}
    written: set[str] = set()
    for stage in stages:
        unknown = (stage.reads | stage.writes) - fields
        if unknown:
            raise TypeError(f"stage {stage.name} names {sorted(unknown)}, not fields of GradingContext")
        early = stage.reads - written
        if early:
            raise TypeError(f"stage {stage.name} reads {sorted(early)} before any stage writes it")
        written |= stage.writes


check_order(STAGES)


def correct_message(ctx: GradingContext) -> str:
    worst = max((c.rel_l2_err or 0.0 for c in ctx.verdict.cases), default=0.0)
    text = (f"correct: all {len(ctx.verdict.cases)} cases of split {ctx.split!r} passed on {ctx.backend.name} "
            f"(worst relative L2 error {worst:.2g}); lowered for TPU at {len(ctx.lowered_cases)} sizes.")
    if ctx.verdict.speedup is not None:
        text += f" Speedup over XLA: {ctx.verdict.speedup:.2f}x."
    uncovered = ctx.verdict.details.get("coverage", {}).get("uncovered") if ctx.task.external is not None else None
    if uncovered:  # an imported task keeps its file's sizes: no case can be derived for these
        text += (f" Not checked (an imported task runs its file's sizes only): {'; '.join(uncovered[:2])}"
                 f"{f' (and {len(uncovered) - 2} more)' if len(uncovered) > 2 else ''}.")
    return text
