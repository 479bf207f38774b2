"""The task contract: what a kernel problem is, independent of any one problem.

A task is a pure-JAX reference, a seeded input maker and a list of cases. The evaluator
only ever talks to tasks through the types in this module, so adding a task never means
touching the evaluator.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, Sequence

import numpy as np

Split = Literal["train", "heldout"]
Size = Literal["check", "bench"]
SPLITS: tuple[str, ...] = ("train", "heldout")
SIZES: tuple[str, ...] = ("check", "bench")

# Features the evaluator can verify in a kernel's jaxpr (see evaluator/analysis/features.py).
KNOWN_FEATURES: tuple[str, ...] = (
    "manual_dma",      # async copies started and waited inside the kernel
    "vmem_scratch",    # a scratch buffer in VMEM (e.g. an f32 accumulator)
    "scalar_prefetch", # indices/metadata prefetched to SMEM and used by index maps
    "parallel_grid",   # at least one grid axis marked "parallel" (megacore sharding)
    "input_output_aliases",  # an output written in place over a large input's buffer
)

# The line of a task.py docstring that names the models its shapes come from (Task.shapes_from).
SHAPES_FROM = "Shapes from:"


@dataclass(frozen=True)
class ArgSpec:
    """Shape and dtype of one kernel argument or output (no data)."""

    shape: tuple[int, ...]
    dtype: str  # numpy/jax dtype name: "float32", "bfloat16", "int32"


@dataclass(frozen=True)
class Case:
    """One problem instance: shape dims, dtype and static params.

    `split` says who may see it (train cases may appear in prompts and data; heldout never);
    `size` says what it is for (check: run under interpret mode in seconds; bench: traced,
    lowered and timed on hardware, never run on a CPU).
    """

    name: str
    split: Split
    size: Size
    dims: dict[str, int]
    dtype: str
    params: dict[str, Any] = field(default_factory=dict)
    stress: str = ""  # the task's Stress regime whose inputs the case runs on ("" for its own inputs)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"case {self.name!r}: split must be one of {SPLITS}, got {self.split!r}")
        if self.size not in SIZES:
            raise ValueError(f"case {self.name!r}: size must be one of {SIZES}, got {self.size!r}")

    def describe(self) -> str:
        return f"{self.name} ({self.sizes()})"

    def sizes(self) -> str:
        """Its dims, dtype and params in words: "M=256, N=512, float32"."""
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        params = "".join(f", {k}={v}" for k, v in self.params.items())
        return f"{dims}, {self.dtype}{params}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Tolerance:
    """When is an output close enough to the reference?

    Element-wise: |out - ref| <= atol * rms(ref) + rtol * |ref| (atol is relative to the
    output's scale, so one policy fits outputs of any magnitude), and the whole-tensor
    relative L2 error ||out - ref|| / ||ref|| <= rel_l2. The L2 bound is what makes zeros,
    constants and garbage fail even where the reference is small everywhere (softmax).
    """

    atol: float
    rtol: float
    rel_l2: float


# What each tolerance is meant to accept (docs/architecture.md, "Numerics"; margins measured by
# benchmarks/seed_stability.py): an honest kernel as a TPU computes it, and nothing a lazy or
# broken one returns (tests/test_tolerance.py: zeros, constants, noise, an input echoed and one
# perturbed block fail every case).
#
# Default: f32 arithmetic outside the MXU (norms, softmax, reductions) is f32 on a TPU too, so
# f32 is tight: honest kernels miss the reference by at most 8.9e-6 relative L2 (20 seeds), and
# the bound of 5e-4 sits under what any bf16 step costs (an f32 output rounded to bf16 once:
# 1.3e-3..2.8e-3; an rms_norm computed in bf16: 3.4e-3) while leaving the chip's transcendentals
# and approximate reciprocals, which interpret mode does not model, far more than they need.
# bf16 outputs carry their own rounding (2**-9 relative) on top.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=1e-2, rtol=1e-2, rel_l2=5e-4),
    "bfloat16": Tolerance(atol=3e-2, rtol=3e-2, rel_l2=1.5e-2),
}
# Tasks whose work is matmuls: at default precision a TPU multiplies f32 operands as bf16 (one
# MXU pass, f32 accumulation), which the evaluator reproduces in interpret mode. The relative L2
# error of such a matmul is ~2.4e-3 (2.3e-3..3.1e-3 for the one-pass tasks over 20 seeds, the
# worst on m=1 held-out rows), and single elements of outputs near zero, or after a gelu, miss
# by up to ~4% of the output's rms (geglu's f32 cases, 3.3e-2 over 20 seeds). The f32 L2 bound
# is about twice the worst honest error: an f32 matmul quantised to int8 per 128-wide K chunk
# (relative L2 9.0e-3..1.1e-2) is not rounding (docs/architecture.md, "Tolerances").
MXU_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=6e-2, rtol=6e-2, rel_l2=6e-3),
    "bfloat16": DEFAULT_TOLERANCES["bfloat16"],
}
# Two default-precision products multiplied together (geglu, swiglu_mlp's gate): each carries
# its own bf16 rounding, so an honest kernel's relative L2 error reaches 4.9e-3 (geglu's
# solution, 20 seeds); twice that is the old MXU bound.
GATED_MXU_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=6e-2, rtol=6e-2, rel_l2=1e-2),
    "bfloat16": DEFAULT_TOLERANCES["bfloat16"],
}
# A softmax over matmul logits (attention forward, gemm_softmax): the inputs are spiky on
# purpose (large logits hide nothing), and rounding q and k to bf16 moves a logit of size ~10
# by ~0.04, which exp() turns into a few percent of a probability: single f32 outputs miss by
# up to ~7% of the output's rms (ragged_attention); relative L2 errors reach 8.2e-3 (20 seeds,
# paged_attention; gemm_softmax's single-row case, up to 1.14e-2, has its own f32 bound, 2.5e-2). Computing
# attention in bf16 costs about what default precision already does, so a tighter L2 bound
# would refuse nothing more. The same holds for bf16 inputs when a kernel scales q in bf16
# before its matmul (splash attention takes q pre-scaled), so both dtypes get the loose
# element-wise bound; L2 still judges.
ATTENTION_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=0.12, rtol=0.12, rel_l2=1.5e-2),
    "bfloat16": Tolerance(atol=0.12, rtol=0.12, rel_l2=1.5e-2),
}


class ExternalReference(Protocol):
    """A reference and input maker that are third-party code (a peer suite's file, suites/):
    run in a sandboxed worker by this object, never in the grader's own process."""

    def sample(self, case: Case, seed: int) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]]:
        """One seed's inputs and the reference's outputs on them (float32)."""

    def outputs(self, case: Case, inputs: Sequence[np.ndarray], tpu_dots: bool = False) -> list[np.ndarray]:
        """The reference's outputs on given inputs (`tpu_dots`: its dots rounded as a TPU's)."""

    def cost(self, case: Case) -> Any:
        """What the reference computes at a case (evaluator.analysis.jaxpr_cost.Cost)."""

    def code_digest(self) -> str:
        """Hash of the code that builds and runs this reference (evaluator/digest.py code_digest):
        with the file's text and the cases, what keys the task's verdicts."""

    def timing_reference(self, case: Case) -> tuple[str, str, list[Any]]:
        """(source, driver function, arguments) from which a worker builds the reference it times
        at a case (evaluator.execution.protocol.Time)."""

    def rebuild(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """(function, arguments) that build this task again in another process (a Ray actor):
        the reference's sandbox does not travel, the suite's location and the task's name do."""


@dataclass(frozen=True)
class Stress:
    """An input regime real data has and a task's default inputs lack: rows whose mean dwarfs
    their spread for a norm, logits large enough to overflow exp without the max taken out, tied
    maxima for an argmax. Default inputs are standard-normal-like, and code that fails only on
    such values (a one-pass variance, a softmax without its running max, the last of equal
    maxima) passes on them. The grader checks every candidate on each regime at a check size,
    the tolerance widened by how much the reference's own float32 rounding moves its outputs
    there (evaluator/truth/stress.py)."""

    name: str         # in case names and feedback: "large_offset"
    description: str  # what the inputs are like, for feedback: "rows whose mean is 100 times their spread"
    make_inputs: Callable[[Case, np.random.Generator], tuple[np.ndarray, ...]]
    # Sizes the regime needs (a long sequence); the check case's otherwise.
    dims: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AdaptedCandidate:
    """A candidate written in a peer suite's format, made gradable: `checked` is what the
    policy judges (their harness dropped), `shim` is appended when it is loaded (a kernel()
    that calls their entry point), `notes` say what was changed."""

    checked: str
    shim: str
    notes: list[str] = field(default_factory=list)


class CandidateFormatError(ValueError):
    """A candidate that does not define the entry point its task asks for."""


@dataclass(frozen=True)
class Task:
    """A kernel problem. See tasks/README.md for how to add one."""

    name: str
    version: int
    level: int
    description: str
    signature: str
    reference: Callable[..., Any]
    arg_specs: Callable[[Case], Sequence[ArgSpec]]
    make_inputs: Callable[[Case, np.random.Generator], tuple[np.ndarray, ...]]
    out_specs: Callable[[Case], Sequence[ArgSpec]]
    cases: tuple[Case, ...]
    solution_path: Path
    required_features: tuple[str, ...] = ()
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    heldout_task: bool = False  # whole task never used for training data
    # Per kernel() argument, inclusive (lo, hi) bounds of the values make_inputs draws for an
    # integer input (None for the others): what a data-dependent loop can run to, so the
    # evaluator counts such loops at their maximum trip count (evaluator/analysis/intervals.py).
    int_bounds: Callable[[Case], Sequence[tuple[int, int] | None]] | None = None
    # The least share of the reference's FLOPs a correct kernel must do: below 1 where the
    # reference computes what a kernel may skip (the masked half of causal attention). The
    # grader's "faster than any kernel doing the work" rule reads it (evaluator/performance/perf_model.py).
    necessary_flops_share: float = 1.0
    # How much less of that work, relative to what it does at the check sizes, an honest kernel
    # may do at a bench size: its FLOPs per unit of work move a little with the shape (padding,
    # the ratio of per-row to per-element work). A kernel that skips blocks or stops a loop early
    # only where it is timed does less (evaluator/stages.py, _missing_work). Raise it only for
    # what the task's honest kernels are measured to need.
    work_slack: float = 0.05
    # The grader derives check cases of its own, growing one dimension of a check case (the
    # coverage stage, evaluator/analysis/coverage.py); where the task's dimensions must agree
    # (a page pool that holds every sequence's pages), this makes such a case agree again.
    fit_case: Callable[[Case], Case] | None = None
    # Input regimes of real data its default inputs lack, each checked at a check size (Stress).
    stresses: tuple[Stress, ...] = ()
    # Index of kernel()'s first parameter argument (a model's weights, after its inputs), None
    # when the task declares none: work on parameters alone is weight folding, which the
    # outside-work rules leave out (evaluator/analysis/parameter_work.py).
    first_parameter: Callable[[Case], int] | None = None
    # Imported tasks (suites/): the reference runs elsewhere, candidates are written in the
    # suite's own format (`entry_point`), prompts show the suite's file, and the TPU generation
    # its sizes were tuned for is the grading default.
    external: ExternalReference | None = None
    adapt_candidate: Callable[[str], AdaptedCandidate] | None = None
    entry_point: str = "kernel"
    # Other names a whole module may define instead: KernelBench-JAX answers rewrite the
    # problem's own `Model` class rather than add a `ModelNew`.
    entry_aliases: tuple[str, ...] = ()
    reference_text: str | None = None
    tpu: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.required_features) - set(KNOWN_FEATURES)
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown required_features {sorted(unknown)}")
        names = [c.name for c in self.cases]
        if len(names) != len(set(names)):
            raise ValueError(f"task {self.name!r}: duplicate case names")
        for split in SPLITS:
            if not any(c.split == split and c.size == "check" for c in self.cases):
                raise ValueError(f"task {self.name!r}: no check-size {split} case")
        for case in self.cases:
            if case.dtype not in self.tolerances:
                raise ValueError(f"task {self.name!r}: no tolerance for dtype {case.dtype!r}")
        stress_names = [s.name for s in self.stresses]
        if len(stress_names) != len(set(stress_names)):
            raise ValueError(f"task {self.name!r}: duplicate stress regimes {stress_names}")

    def __reduce_ex__(self, protocol: int) -> Any:
        """A task crosses processes as itself (a `dataclasses.replace`d one too); an imported one
        as the way to build it again there, since its reference lives in a sandbox here."""
        if self.external is not None:
            return self.external.rebuild()
        return object.__reduce_ex__(self, protocol)

    @property
    def entry_points(self) -> tuple[str, ...]:
        """What a candidate module may define for this task, the preferred name first."""
        return (self.entry_point, *self.entry_aliases)

    def select(self, split: str = "all", size: str | None = None) -> list[Case]:
        """Cases of a split ('train', 'heldout' or 'all'), optionally of one size."""
        if split not in (*SPLITS, "all"):
            raise ValueError(f"split must be train, heldout or all, got {split!r}")
        return [
            c for c in self.cases
            if (split == "all" or c.split == split) and (size is None or c.size == size)
        ]

    def arg_bounds(self, case: Case) -> list[tuple[int, int] | None]:
        """Bounds of each kernel() argument's values at a case, aligned with arg_specs: the
        task's int_bounds, None for float arguments and for tasks that give none. What
        `evaluator.analysis.jaxpr_analysis.summarize(..., arg_bounds=...)` takes."""
        n = len(self.arg_specs(case))
        if self.int_bounds is None:
            return [None] * n
        bounds = [None if b is None else (int(b[0]), int(b[1])) for b in self.int_bounds(case)]
        if len(bounds) != n or any(b is not None and b[0] > b[1] for b in bounds):
            raise ValueError(f"task {self.name!r}: int_bounds {bounds} at case {case.name} is not "
                             f"one (lo <= hi) pair or None per argument ({n} arguments)")
        return bounds

    def inputs(self, case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        """A case's inputs: its stress regime's (Case.stress), else the task's own."""
        if not case.stress:
            return self.make_inputs(case, rng)
        found = [s for s in self.stresses if s.name == case.stress]
        if not found:
            raise ValueError(f"task {self.name!r} has no stress regime {case.stress!r}")
        return found[0].make_inputs(case, rng)

    def solution_source(self) -> str:
        return self.solution_path.read_text()

    @property
    def shapes_from(self) -> str:
        """The models whose configs the task's shapes come from: the `Shapes from:` line that ends
        task.py's docstring, where the configs are cited ('' without one, or for imported tasks)."""
        folder = self.solution_path.parent
        if self.external is not None or not (folder / "task.py").is_file():
            return ""
        doc = importlib.import_module(f"tasks.{folder.name}.task").__doc__ or ""
        found = [line for line in doc.splitlines() if line.startswith(SHAPES_FROM)]
        return found[-1].removeprefix(SHAPES_FROM).strip().rstrip(".") if found else ""

    def is_ragged(self, case: Case) -> bool:
        """Whether the case's main operand or output is off the TPU's (8, 128) tile: a last dim
        not a multiple of 128 or a second-to-last not a multiple of 8. Such cases are the ones
        where grid rounding, edge masks and padding decide correctness."""
        arrays = (self.arg_specs(case)[0].shape, self.out_specs(case)[0].shape)
        return any((s[-1] % 128 != 0) or (len(s) >= 2 and s[-2] % 8 != 0) for s in arrays if s)

    @property
    def dtypes(self) -> list[str]:
        return sorted({c.dtype for c in self.cases})

    def summary(self) -> dict[str, Any]:
        """What `python -m evaluator tasks --json` prints for this task."""
        return {
            "name": self.name,
            "version": self.version,
            "level": self.level,
            "description": self.description,
            "signature": self.signature,
            "dtypes": self.dtypes,
            "required_features": list(self.required_features),
            "heldout_task": self.heldout_task,
            "shapes_from": self.shapes_from,
            "cases": {
                f"{split}/{size}": len(self.select(split, size)) for split in SPLITS for size in SIZES
            },
        }


def case_grid(
    split: Split, size: Size, dims_list: Sequence[dict[str, int]], dtypes: Sequence[str],
    params: dict[str, Any] | None = None,
) -> list[Case]:
    """Cases for every (dims, dtype) pair, named from their values so names stay unique."""
    cases = []
    for dims in dims_list:
        for dtype in dtypes:
            short = {"float32": "f32", "bfloat16": "bf16"}.get(dtype, dtype)
            label = "_".join(f"{k}{v}" for k, v in dims.items())
            cases.append(Case(f"{split}_{size}_{label}_{short}", split, size, dict(dims), dtype,
                              dict(params or {})))
    return cases


def activation_shape(case: Case) -> tuple[int, ...]:
    """Input shape of a row-wise op: [rows, d] when the case has `rows`, else [b, s, d]."""
    d = case.dims
    return (d["rows"], d["d"]) if "rows" in d else (d["b"], d["s"], d["d"])


def normal(rng: np.random.Generator, shape: Sequence[int], dtype: str, scale: float = 1.0,
           shift: float = 0.0) -> np.ndarray:
    """Gaussian input cast to `dtype` (bf16 via ml_dtypes, which ships with jax)."""
    values = rng.standard_normal(tuple(shape), dtype=np.float32) * scale + shift
    return values.astype(np_dtype(dtype))


def np_dtype(name: str) -> np.dtype:
    """numpy dtype from its name, ml_dtypes' (bfloat16, float8_*, int4) included."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
