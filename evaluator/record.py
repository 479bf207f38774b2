"""The verdict record: one serialisable result for every outcome, never None.

The same record flows from the evaluator into data_gen, the datasets and the reports.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Every status a verdict can carry, in the order of the stage that produces it.
STATUSES: tuple[str, ...] = (
    "extraction_error",     # 1 extract: no code found in the answer
    "syntax_error",         # 2 policy: the code does not parse
    "policy_violation",     # 2 policy: forbidden import / call / name, or interpret=
    "import_error",         # 3 load: executing the module failed or defines no kernel()
    "no_kernel",            # 4 structure: no pallas_call at all
    "work_outside_kernel",  # 4 structure: matmul or a real share of the work outside kernels, host callbacks
    "missing_feature",      # 5 features: a required TPU feature is not used
    "lowering_error",       # 6 lowering: tracing or Pallas -> Mosaic lowering failed
    "compile_error",        # 6 lowering: the TPU compiler (or its VMEM budget model) rejects it
    "grader_limit",         # 7 run: the grader cannot run this program yet (its limit, not the kernel's fault)
    "runtime_error",        # 7 run: an exception, race, out-of-bounds access or crash while running
                            # (4a grid: a block index out of range at a bench size)
    "timeout",              # any worker stage: ran past its time limit
    "wrong_shape",          # 7 run: output shape, dtype or arity differs from the reference
    "wrong_output",         # 7 run: values outside tolerance (or NaN/inf)
                            # (4a grid: an output block never written, an argument not read in full)
    "correct",              # all stages passed
)


@dataclass
class CaseResult:
    """What happened on one case (all seeds of it)."""

    name: str
    split: str
    dims: dict[str, int]
    dtype: str
    params: dict[str, Any]
    status: str = "pending"
    seeds: list[int] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    mismatch_fraction: float | None = None
    worst_index: list[int] | None = None  # where max |out - ref| / allowed is largest
    bound_ratio: float | None = None  # largest error / its bound over the seeds (1.0 = at tolerance)
    error: str | None = None  # first lines of the real error, if any
    run_s: float | None = None


@dataclass
class StageTiming:
    stage: str
    seconds: float


@dataclass
class Verdict:
    """The evaluator's answer for one (task, candidate) pair."""

    task: str
    task_version: int
    status: str
    message: str  # one short paragraph: the feedback a model reads
    backend: str
    split: str
    stage: str  # the stage that decided the verdict ("done" when correct)
    cases: list[CaseResult] = field(default_factory=list)
    speedup: float | None = None  # reference time / kernel time, real hardware only
    timings: dict[str, Any] = field(default_factory=dict)  # raw timing samples (hardware only)
    stage_timings: list[StageTiming] = field(default_factory=list)
    error_type: str | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # stage-specific facts (costs, VMEM...)
    versions: dict[str, str] = field(default_factory=dict)
    candidate_sha256: str = ""
    wall_s: float = 0.0
    cached: bool = False  # read back from the verdict cache (evaluator/cache.py), not graded now

    @property
    def ok(self) -> bool:
        return self.status == "correct"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        """Inverse of to_dict: a verdict read back from a journal or a report."""
        data = dict(data)
        data["cases"] = [CaseResult(**c) for c in data.get("cases", [])]
        data["stage_timings"] = [StageTiming(**t) for t in data.get("stage_timings", [])]
        return cls(**data)
