"""The verdict record: one serialisable result for every outcome, never None.

The same record flows from the evaluator into data_gen, the datasets and the reports.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tasks.spec import Case


class Status(StrEnum):
    """Every status a verdict can carry, in the order of the stage that produces it: the one
    list (a new status is a member here; `Failure` refuses any other string). Members compare
    equal to their strings, so records and JSON hold plain text."""

    EXTRACTION_ERROR = "extraction_error"        # 1 extract: no code found in the answer
    SYNTAX_ERROR = "syntax_error"                # 2 policy: the code does not parse
    POLICY_VIOLATION = "policy_violation"        # 2 policy: forbidden import / call / name, or interpret=
    IMPORT_ERROR = "import_error"                # 3 load: executing the module failed or defines no kernel()
    NO_KERNEL = "no_kernel"                      # 4 structure: no pallas_call at all
    WORK_OUTSIDE_KERNEL = "work_outside_kernel"  # 4 structure: matmul or a real share of the work outside
                                                 #   kernels, host callbacks
    MISSING_FEATURE = "missing_feature"          # 5 features: a required TPU feature is not used
    LOWERING_ERROR = "lowering_error"            # 6 lowering: tracing or Pallas -> Mosaic lowering failed
    COMPILE_ERROR = "compile_error"              # 6 lowering: the TPU compiler (or its VMEM model) rejects it
    GRADER_LIMIT = "grader_limit"                # 7 run: the grader cannot run this program yet (its limit,
                                                 #   not the kernel's fault)
    RUNTIME_ERROR = "runtime_error"              # 7 run: an exception, race, out-of-bounds access or crash
                                                 #   (4a grid: a block index out of range at a bench size)
    TIMEOUT = "timeout"                          # any worker stage: ran past its time limit
    WRONG_SHAPE = "wrong_shape"                  # 7 run: output shape, dtype or arity differs
    WRONG_OUTPUT = "wrong_output"                # 7 run: values outside tolerance (or NaN/inf)
                                                 #   (4a grid: an output block never written, an argument
                                                 #   not read in full)
    UNVERIFIED = "unverified"                    # 9 verified: every case passed, but part of what the bench
                                                 #   program runs could not be checked here (named)
    CORRECT = "correct"                          # all stages passed
    PENDING = "pending"                          # not a verdict: a grading stopped early (`through=`)
                                                 #   with no failure, or a case not run yet


# The statuses a finished grading ends with.
STATUSES: tuple[str, ...] = tuple(s.value for s in Status if s is not Status.PENDING)
# Statuses that confirm nothing against the kernel: the grader could not run it, or could not
# check all of it. Neither correct nor a failure to repair.
UNDECIDED: frozenset[Status] = frozenset({Status.GRADER_LIMIT, Status.UNVERIFIED})


@dataclass
class BlockFigure:
    """One VMEM buffer of a kernel: its role (input, output, scratch), block shape, dtype and
    how many copies the pipeline keeps."""

    role: str
    shape: list[int]
    dtype: str
    buffers: int


@dataclass
class VmemFinding:
    """Why a kernel does not fit VMEM, as numbers (the message says the same in words)."""

    kernel: str
    case: str
    need_bytes: int                    # the least its pipelined blocks and scratch take
    limit_bytes: int                   # the budget it was held to
    limit_source: str                  # where that budget comes from (a vmem_limit_bytes, the default)
    requested_limit_bytes: int | None  # the kernel's own vmem_limit_bytes, if it set one
    generation_bytes: int              # the generation's whole VMEM
    blocks: list[BlockFigure] = field(default_factory=list)


@dataclass
class CaseResult:
    """What happened on one case (all seeds of it)."""

    name: str
    split: str
    dims: dict[str, int]
    dtype: str
    params: dict[str, Any]
    status: Status = Status.PENDING
    seeds: list[int] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    mismatch_fraction: float | None = None
    worst_index: list[int] | None = None  # where max |out - ref| / allowed is largest
    bound_ratio: float | None = None  # largest error / its bound over the seeds (1.0 = at tolerance)
    error: str | None = None  # first lines of the real error, if any
    run_s: float | None = None  # the worker's time on this case: compile_s + the seeds' runs
    # Where the time went (benchmarks/grading_profile.py): compiling the case's program(s) in
    # the worker, each seed's run and the interpret-mode checks it ran under
    # (evaluator/execution/handlers.py, run), and the host's inputs, expected outputs and comparison.
    compile_s: float | None = None
    seed_run_s: list[float] = field(default_factory=list)
    seed_checks: list[str] = field(default_factory=list)
    reference_s: float | None = None  # its inputs and expected outputs (and the next case's, made ahead)
    compare_s: float | None = None
    limit_s: float | None = None  # the time the worker was given for this case (evaluator/execution/step_limits.py)

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # an unknown status is a bug, caught where it is made


@dataclass
class StageTiming:
    stage: str
    seconds: float


@dataclass
class Verdict:
    """The evaluator's answer for one (task, candidate) pair."""

    task: str
    task_version: int
    status: Status
    message: str  # one short paragraph: the feedback a model reads
    backend: str
    split: str
    stage: str  # the stage that decided the verdict ("done" when correct)
    cases: list[CaseResult] = field(default_factory=list)
    speedup: float | None = None  # reference time / kernel time, real hardware only
    # Static: XLA's predicted time over the kernel's at each bench case and their median, with the
    # generation and method (evaluator/performance/prediction.py, PredictedSpeedup); None before lowering.
    predicted_speedup: dict[str, Any] | None = None
    timings: dict[str, Any] = field(default_factory=dict)  # raw timing samples (hardware only)
    stage_timings: list[StageTiming] = field(default_factory=list)
    error_type: str | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # stage-specific facts (costs, traffic...)
    # Typed facts later consumers read (data_gen's explanations, reports): never parsed from text.
    failing_case: Case | None = None  # the case the deciding failure happened at, if any
    vmem: VmemFinding | None = None   # a kernel over its VMEM budget (compile_error)
    versions: dict[str, str] = field(default_factory=dict)
    candidate_sha256: str = ""
    wall_s: float = 0.0
    cached: bool = False  # read back from the verdict cache (evaluator/cache.py), not graded now

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def ok(self) -> bool:
        return self.status == Status.CORRECT

    @property
    def undecided(self) -> bool:
        """The grader could not decide (UNDECIDED): no fault is confirmed, none is ruled out."""
        return self.status in UNDECIDED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        """Inverse of to_dict: a verdict read back from a journal or a report."""
        data = dict(data)
        data["cases"] = [CaseResult(**c) for c in data.get("cases", [])]
        data["stage_timings"] = [StageTiming(**t) for t in data.get("stage_timings", [])]
        if data.get("failing_case") is not None:
            data["failing_case"] = Case(**data["failing_case"])
        if data.get("vmem") is not None:
            vmem = dict(data["vmem"])
            vmem["blocks"] = [BlockFigure(**b) for b in vmem.get("blocks", [])]
            data["vmem"] = VmemFinding(**vmem)
        return cls(**data)
