"""Block-size tuning without a TPU: search a kernel's knobs with the static performance model.

`python -m evaluator tune --task T --candidate F` finds the knobs (evaluator/candidate/knobs.py),
grades each setting through every static stage (policy, tracing, structure, Mosaic lowering,
the VMEM budget of the --tpu generation, the estimate at the task's bench sizes: nothing
runs), ranks the settings by the estimate's worst slowdown vs the ideal kernel over the bench
cases, confirms the best with libtpu for that generation when `tpu-compile` is installed, and
checks that it is still correct on the split's check sizes. The search is coordinate
descent: sweep one knob at a time from the best setting so far until no sweep improves,
then try pairs of knobs together while the budget lasts (VMEM often trades one block for
another).
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from evaluator.candidate.knobs import Knob, choices, find_knobs, rewrite
from evaluator.grader import Evaluator
from evaluator.performance.perf_model import worst_bench_case
from evaluator.record import Status, Verdict
from evaluator.stages import LAST_STATIC_STAGE
from tasks.spec import Task

MiB = 1 << 20
VERIFY_AT_MOST = 4  # ranked settings tried in turn when the best fails libtpu or the check


class TuneError(ValueError):
    """The candidate cannot be tuned as given (it fails before any setting is compared)."""


@dataclass
class Trial:
    """One setting of the knobs, as the static stages saw it."""

    setting: dict[str, int]
    status: Status  # PENDING: every static stage passed; else the failing stage's status
    message: str = ""
    case: str = ""  # the bench case with the worst slowdown: the figures below are its
    slowdown: float = math.inf
    time_s: float = math.inf
    hbm_bytes: float = math.inf
    vmem_bytes: int = 0  # the most a kernel needs at any traced case (a lower bound)

    @property
    def ok(self) -> bool:
        return self.status == Status.PENDING

    def key(self) -> tuple[bool, float, float, float]:
        """Sort key: legal settings first, then the worst slowdown, its time, its bytes (of
        two settings the model cannot tell apart, the one that moves less is safer)."""
        return (not self.ok, round(self.slowdown, 4), round(self.time_s, 9), self.hbm_bytes)

    @classmethod
    def from_verdict(cls, setting: dict[str, int], verdict: Verdict) -> "Trial":
        trial = cls(dict(setting), verdict.status, verdict.message)
        vmem = verdict.details.get("vmem_lower_bound_bytes", {})
        trial.vmem_bytes = max(vmem.values(), default=0)
        worst = worst_bench_case(verdict.details.get("perf_model", {}))
        if worst is not None:
            trial.case, est = worst
            trial.slowdown, trial.time_s, trial.hbm_bytes = (
                est["slowdown_vs_ideal"], est["time_s"], est["hbm_bytes"])
        return trial


@dataclass
class TuneResult:
    task: str
    generation: str
    knobs: list[Knob]
    baseline: Trial
    trials: list[Trial]  # every setting tried, best first
    best: Trial  # the best setting that passed verification (the baseline if none did)
    source: str  # the candidate rewritten with `best`
    verified: str  # how `best` was confirmed, in words
    elapsed_s: float
    budget_exhausted: bool = False
    rejected: list[tuple[Trial, str]] = field(default_factory=list)  # failed verification


def static_trial(task: Task, source: str, evaluator: Evaluator, split: str = "train",
                 setting: dict[str, int] | None = None) -> Trial:
    """Grade `source` through every static stage and read the estimate (nothing runs)."""
    verdict = evaluator.grade(task, source, split=split, through=LAST_STATIC_STAGE)
    return Trial.from_verdict(setting or {}, verdict)


def tune(task: Task, source: str, evaluator: Evaluator, split: str = "train",
         budget_s: float = 110.0, compile_evaluator: Evaluator | None = None,
         progress: Callable[[int, Trial], None] | None = None) -> TuneResult:
    """Search the knobs of `source` on `evaluator` (whose generation sets the VMEM budget and
    the model's figures). `compile_evaluator` (a tpu-compile one) confirms the winner."""
    start = time.perf_counter()
    knobs = find_knobs(source)
    max_dim = max((d for c in task.select(split) for d in c.dims.values()), default=128)
    options = {k.name: choices(k, max_dim) for k in knobs}
    seen: dict[tuple, Trial] = {}

    def evaluate(setting: dict[str, int]) -> Trial:
        key = tuple(sorted(setting.items()))
        if key not in seen:
            seen[key] = static_trial(task, rewrite(source, knobs, setting), evaluator, split, setting)
            if progress is not None:
                progress(len(seen), seen[key])
        return seen[key]

    def out_of_time() -> bool:
        return time.perf_counter() - start > budget_s

    baseline = evaluate({k.name: k.value for k in knobs})
    if not baseline.ok:
        raise TuneError(f"the candidate as given fails the static stages, so there is nothing to "
                        f"tune: {baseline.message}")
    best = baseline
    exhausted = _coordinate_descent(knobs, options, evaluate, best, out_of_time)
    best = min(seen.values(), key=Trial.key)
    if not exhausted:
        exhausted = _pair_sweeps(knobs, options, evaluate, best, out_of_time)
    trials = sorted(seen.values(), key=Trial.key)
    winner, verified, rejected = _verify(task, source, knobs, trials, evaluator,
                                         compile_evaluator, split, baseline)
    return TuneResult(task.name, evaluator.generation.name, knobs, baseline, trials, winner,
                      rewrite(source, knobs, winner.setting), verified,
                      time.perf_counter() - start, exhausted, rejected)


def _coordinate_descent(knobs: list[Knob], options: dict[str, list[int]],
                        evaluate: Callable[[dict[str, int]], Trial], best: Trial,
                        out_of_time: Callable[[], bool]) -> bool:
    """Sweep each knob alone from the best setting until a full round improves nothing.
    Returns True when the budget ran out first."""
    improved = True
    while improved:
        improved = False
        for knob in knobs:
            for value in options[knob.name]:
                if out_of_time():
                    return True
                trial = evaluate({**best.setting, knob.name: value})
                if trial.key() < best.key():
                    best, improved = trial, True
    return False


def _pair_sweeps(knobs: list[Knob], options: dict[str, list[int]],
                 evaluate: Callable[[dict[str, int]], Trial], best: Trial,
                 out_of_time: Callable[[], bool]) -> bool:
    """Every pair of knobs over all their values from the best setting: catches moves that
    need two knobs at once (a larger block fits only beside a smaller one)."""
    for a, b in itertools.combinations(knobs, 2):
        for va, vb in itertools.product(options[a.name], options[b.name]):
            if out_of_time():
                return True
            trial = evaluate({**best.setting, a.name: va, b.name: vb})
            if trial.key() < best.key():
                best = trial
    return False


def _verify(task: Task, source: str, knobs: list[Knob], trials: list[Trial],
            evaluator: Evaluator, compile_evaluator: Evaluator | None, split: str,
            baseline: Trial) -> tuple[Trial, str, list[tuple[Trial, str]]]:
    """The best legal setting that libtpu compiles (when given) and that is correct on the
    split's check sizes; the baseline when none of the first few is."""
    rejected = []
    for trial in [t for t in trials if t.ok][:VERIFY_AT_MOST]:
        candidate = rewrite(source, knobs, trial.setting)
        if compile_evaluator is not None:
            compiled = compile_evaluator.grade(task, candidate, split=split, through="lowering")
            if compiled.status != Status.PENDING:
                rejected.append((trial, compiled.message))
                continue
        verdict = evaluator.grade(task, candidate, split=split)
        if not verdict.ok:
            rejected.append((trial, verdict.message))
            continue
        how = f"correct on the {len(verdict.cases)} check cases of split {split!r}"
        if compile_evaluator is not None:
            how += f", compiled by libtpu for {compile_evaluator.generation.name}"
        return trial, how, rejected
    return baseline, "no tuned setting passed verification: the candidate as given", rejected


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None
