"""JAXBench checkouts as tasks: `benchmark/<N><p|k>_<Name>/` workloads and `jaxkernelbench/`
problems, graded like our own tasks (docs/peer-suites.md).

Names (scripts depend on them): `jaxbench/8p_GEMM` for `benchmark/8p_GEMM/baseline.py`,
`kernelbench-jax/level1/23_Softmax` for `jaxkernelbench/level1/23_Softmax.py`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from evaluator.candidate.policy import parse_module
from suites import sizes
from suites.oracle import Described, ReferenceFailed, ReferenceRunner, SuiteReference, describe
from suites.source import (SizeEdit, config_sizes, default_dtype, function_reads, literal_sizes, module_constants,
                           rewrite_sizes, strip_harness, top_level_names)
from tasks.spec import (DEFAULT_TOLERANCES, AdaptedCandidate, ArgSpec, CandidateFormatError, Case, Task, Tolerance,
                        case_grid)

WORKLOADS = "benchmark"
PROBLEMS = "jaxkernelbench"
# The baselines their pallas_eval harness graded its generated priority kernels against
# (`pallas_eval/evaluate.py`: `priority_kernels/<name>/baseline.py` for `<name>.py`): the
# `benchmark/` workloads at smaller sizes, megablox_gmm and ragged_paged_attention reworked.
PRIORITY = "priority_kernels"
# JAXBench measured on v6e and tuned its blocks for v6e's VMEM.
TUNED_FOR = "v6e"
# A workload does not say which of its reference's FLOPs an honest kernel may skip (the masked
# blocks of causal attention: 1p_Flash_Attention's optimized.py does 101% of them at its check
# size, one block, and 76% at its bench size), so the bench work floor stays at half of the
# check sizes' share (tasks.spec.Task.work_slack), where our own tasks declare what they skip.
IMPORTED_WORK_SLACK = 0.5
# Their workloads mix matmuls, softmax and norms in one function: the tolerance of our matmul and
# attention tasks (MXU rounding, softmax over matmul logits); the relative L2 bound still fails
# zeros, constants and noise.
SUITE_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=6e-2, rtol=6e-2, rel_l2=1.5e-2),
    "bfloat16": Tolerance(atol=0.12, rtol=0.12, rel_l2=2e-2),
    "float16": DEFAULT_TOLERANCES["bfloat16"],
}


class LoadError(RuntimeError):
    """A workload or problem that cannot become a task; the message says why."""


class RefusedWhenRun(LoadError):
    """Its reference traces at every size but was refused when run (a constant output)."""


@dataclass(frozen=True)
class Entry:
    """One workload folder or problem file of a checkout."""

    name: str
    kind: str  # "workload" (create_inputs + workload) or "model" (Model + get_inputs)
    path: Path
    level: int
    optimized: Path | None = None


def discover(root: Path) -> list[Entry]:
    """Every workload and problem of a JAXBench checkout, in name order."""
    if not (root / WORKLOADS).is_dir() and not (root / PROBLEMS).is_dir():
        raise FileNotFoundError(f"{root} is not a JAXBench checkout: it has neither {WORKLOADS}/ "
                                f"nor {PROBLEMS}/")
    entries = []
    for folder in sorted((root / WORKLOADS).glob("*/")):
        baseline = folder / "baseline.py"
        if baseline.is_file():
            optimized = folder / "optimized.py"
            level = 3 if folder.name.split("_")[0].endswith("p") else 2
            entries.append(Entry(f"jaxbench/{folder.name}", "workload", baseline, level,
                                 optimized if optimized.is_file() else None))
    for baseline in sorted((root / PRIORITY).glob("*/baseline.py")):
        entries.append(Entry(f"jaxbench-priority/{baseline.parent.name}", "workload", baseline, 3))
    for level in (1, 2):
        for path in sorted((root / PROBLEMS / f"level{level}").glob("*.py")):
            if path.name != "__init__.py":
                entries.append(Entry(f"kernelbench-jax/level{level}/{path.stem}", "model", path, level))
    return entries


@dataclass
class Loaded:
    """How a task was built, for `check-suite`."""

    task: Task
    cap: int  # the power-of-two cap of the check sizes (2048: the full rule held)
    hard_coded: bool  # shapes are literals in the input maker, rewritten by value
    heldout_kind: str
    repaired: list[str]
    notes: list[str] = field(default_factory=list)
    counts_divided_by: int = 1  # batch and heads of the check sizes, divided to fit
    ran: bool = True  # the reference was run on drawn inputs (False: built for static stages only)


LITERAL = "n"  # prefix of a size known only by its literal value: n224_ (case names read n224_32)


class FileSizes:
    """A file's bench sizes and how to rewrite them."""

    def __init__(self, entry: Entry, source: str):
        self.entry, self.source = entry, source
        if entry.kind == "workload":
            self.original = config_sizes(source)
            makers = ("create_inputs",)
            hard_coded = not function_reads(source, "create_inputs", "CONFIG")
            self.scopes = frozenset({"create_inputs", "workload"}) if hard_coded else frozenset()
            self.dtype = default_dtype(source) or "float32"
        else:
            self.original = module_constants(source)
            # Sizes written as literals in get_inputs() often recur in get_init_inputs()
            # (channels): both are rewritten by value, so they keep agreeing.
            makers = ("get_inputs", "get_init_inputs")
            self.scopes = frozenset(makers)
            self.dtype = "float32"
        # Literal sizes of the input makers that are no named size (`(16, 64, 128, 128)`): sizes
        # too, named by value (n128), rewritten by value.
        literals = set().union(*(literal_sizes(source, f) for f in makers if self.scopes)) - set(self.original.values())
        self.literal_keys = {f"{LITERAL}{v}_": v for v in sorted(literals)}
        self.original.update(self.literal_keys)
        self.hard_coded = bool(self.scopes) and (entry.kind == "workload" or bool(literals))

    def source_for(self, dims: dict[str, int]) -> str:
        """The file rewritten to `dims`."""
        named = {k: v for k, v in dims.items() if k not in self.literal_keys}
        by_value = {self.original[k]: v for k, v in dims.items() if k in self.literal_keys}
        if self.entry.kind == "workload":
            if self.hard_coded:
                by_value.update({self.original[k]: v for k, v in named.items()})
            edit = SizeEdit(config=named, literals=by_value, literal_scopes=self.scopes)
        else:
            edit = SizeEdit(constants=named, literals=by_value, literal_scopes=self.scopes)
        return rewrite_sizes(self.source, edit)


def load(entry: Entry, runner: ReferenceRunner, run_reference: bool = True) -> Loaded:
    """Build the task for one entry, running their code only in the runner's worker.

    Sizes and costs come from tracing their code (abstract: `describe`); `run_reference` then
    draws inputs and runs the reference once at a check size, which refuses a reference whose
    output is constant and names the all-zero inputs redrawn. Only graders that run the reference
    need that; on a cold checkout it is most of a build (a 3-D transposed convolution's reference
    takes 20 s on the CPU), so `estimate`, which runs nothing, builds without it."""
    text = entry.path.read_text()
    stripped = strip_harness(text).source
    missing = {"workload": ("create_inputs", "workload"), "model": ("Model", "get_inputs")}[entry.kind]
    defined = top_level_names(stripped)
    if any(m not in defined for m in missing):
        raise LoadError(f"{entry.path.name} does not define {' and '.join(m for m in missing if m not in defined)}")
    fs = FileSizes(entry, stripped)
    fit = _fit_check_sizes(fs, runner)
    check, check_case = fit.dims, fit.built
    cases: list[Case] = []
    sources: dict[str, str] = {}
    described: dict[str, Described] = {}

    def add(split: str, size: str, dims: dict[str, int], built: tuple[str, Described]) -> None:
        case = case_grid(split, size, [dims], [fs.dtype])[0]
        cases.append(case)
        sources[case.name], described[case.name] = built

    add("train", "check", check, check_case)
    heldout_kind, heldout, heldout_case = "none the reference accepts: the train sizes", check, check_case
    for kind, dims in sizes.heldout_variants(check, fs.original):
        try:
            heldout_case = _build(fs, dims, runner)
        except ReferenceFailed:
            continue
        heldout_kind, heldout = kind, dims
        break
    add("heldout", "check", heldout, heldout_case)
    notes = []
    for split, dims in (("train", fs.original), ("heldout", sizes.batch_one(fs.original, fs.original))):
        if split == "heldout" and dims == fs.original:
            continue  # no batch dimension to change
        try:
            add(split, "bench", dims, _build(fs, dims, runner))
        except ReferenceFailed as exc:
            notes.append(f"no {split} bench size: {exc}")
    reference = SuiteReference(runner, entry.kind, fs.dtype, sources, described)
    if run_reference:
        try:
            reference.sample(cases[0], 0)
        except ReferenceFailed as exc:
            raise RefusedWhenRun(str(exc)) from None
    task = _task(entry, stripped, cases, reference)
    return Loaded(task, fit.cap, fs.hard_coded, heldout_kind, sorted(reference.repaired), notes,
                  fit.counts_divided_by, run_reference)


def _build(fs: FileSizes, dims: dict[str, int], runner: ReferenceRunner) -> tuple[str, Described]:
    """The file rewritten to `dims`, and what their reference makes of it (ReferenceFailed if
    it cannot run at those sizes)."""
    source = fs.source_for(dims)
    return source, describe(runner, source, fs.entry.kind, fs.dtype)


@dataclass
class CheckFit:
    """The train check sizes found for a file, and how: the cap on the extents' power of two,
    and the factor the counts were divided by (1: not at all)."""

    dims: dict[str, int]
    cap: int
    counts_divided_by: int
    built: tuple[str, Described]


def _fit_check_sizes(fs: FileSizes, runner: ReferenceRunner) -> CheckFit:
    """The largest check sizes, by the power-of-two rule, whose arguments, outputs and reference
    work fit interpret mode's budgets. Counts (heads, a small batch) shrink first, by the
    smallest power of two that fits: a tuned kernel's blocks span extents, never counts. The
    cap on the extents comes down only where counts of 1 do not fit either."""
    counts = sizes.count_names(fs.original, by_value=fs.hard_coded)
    last_error = None
    for cap in sizes.CAPS:
        dims = sizes.scale_all(fs.original, cap)
        try:
            built = _fits(fs, dims, runner)
        except ReferenceFailed as exc:
            last_error = exc
            continue
        last_error = None
        if built is not None:
            return CheckFit(dims, cap, 1, built)
        fit = _divide_counts_to_fit(fs, dims, counts, cap, runner)
        if fit is not None:
            return fit
    if last_error is not None:
        raise LoadError(f"their code fails at every check size tried: {last_error}")
    raise LoadError(f"no check size within {sizes.MAX_CHECK_ELEMENTS} elements and "
                    f"{sizes.MAX_CHECK_FLOPS:.0e} FLOPs (scaling the sizes {fs.original})")


def _divide_counts_to_fit(fs: FileSizes, dims: dict[str, int], counts: list[str], cap: int,
                          runner: ReferenceRunner) -> CheckFit | None:
    """The smallest power-of-two division of the counts that fits at these extents, or None
    when counts of 1 do not fit either. Undivided they did not fit; fitting only gets easier
    as counts shrink, so a binary search over the exponent finds it."""

    def attempt(exponent: int) -> CheckFit | None:
        trial = sizes.divide_counts(dims, counts, 1 << exponent)
        try:
            built = _fits(fs, trial, runner)
        except ReferenceFailed:
            return None
        return None if built is None else CheckFit(trial, cap, 1 << exponent, built)

    low, high = 0, sizes.largest_count_factor(dims, counts).bit_length() - 1
    best = attempt(high) if high > 0 else None
    if best is None:
        return None
    while high - low > 1:  # 2**low does not fit, 2**high does
        mid = (low + high) // 2
        found = attempt(mid)
        if found is None:
            low = mid
        else:
            best, high = found, mid
    return best


def _fits(fs: FileSizes, dims: dict[str, int], runner: ReferenceRunner) -> tuple[str, Described] | None:
    """The case built at `dims` if it is within interpret mode's budgets, else None."""
    built = _build(fs, dims, runner)
    d = built[1]
    return built if d.elements <= sizes.MAX_CHECK_ELEMENTS and d.cost.flops <= sizes.MAX_CHECK_FLOPS else None


def _runs_in_the_sandbox(*args: Any) -> Any:
    raise RuntimeError("an imported task's reference is third-party code: it runs in a sandboxed "
                       "worker (Task.external), never in this process")


def _task(entry: Entry, stripped: str, cases: list[Case], reference: SuiteReference) -> Task:
    described = reference.described
    check = described[cases[0].name]
    docstring = (ast.get_docstring(parse_module(stripped)) or "").strip().splitlines()
    about = docstring[0].strip() if docstring else entry.path.stem
    if entry.kind == "workload":
        entry_point = "workload"
        args = ", ".join(f"{n}{_shape(s, d)}" for n, (s, d) in zip(check.names, check.args))
        signature = f"workload({args}) -> {', '.join(_shape(s, d) for s, d in check.outs)}"
        how = ("Write the module in JAXBench's optimized.py format: a `workload` taking the same "
               "positional arrays as the baseline below and returning the same array, its work done in "
               "Pallas kernels. CONFIG holds the case's sizes when workload() is called.")
    else:
        entry_point = "ModelNew"
        inputs = ", ".join(f"{n}{_shape(s, d)}" for n, (s, d) in
                           zip(check.names[:check.n_inputs], check.args[:check.n_inputs]))
        weights = ", ".join(n for n in check.names[check.n_inputs:]) or "none"
        signature = f"ModelNew(*get_init_inputs()).forward({inputs}) (weights: {weights})"
        how = ("Write the module in KernelBench's format: a class `ModelNew` built like `Model` below "
               "(same __init__ arguments, same weight attributes, which the grader sets) whose "
               "forward() does the work in Pallas kernels.")
    return Task(
        name=entry.name, version=1, level=entry.level,
        description=f"{about} ({entry.path.parent.name}/{entry.path.name} of JAXBench). {how}",
        signature=signature,
        reference=_runs_in_the_sandbox,
        arg_specs=lambda case: [ArgSpec(s, d) for s, d in described[case.name].args],
        out_specs=lambda case: [ArgSpec(s, d) for s, d in described[case.name].outs],
        make_inputs=lambda case, rng: reference.sample(case, int(rng.integers(2**31)))[0],
        cases=tuple(cases),
        solution_path=entry.optimized or entry.path,
        tolerances=dict(SUITE_TOLERANCES),
        work_slack=IMPORTED_WORK_SLACK,
        external=reference,
        adapt_candidate=partial(adapt_candidate, entry.kind, _case_table(cases, described)),
        entry_point=entry_point,
        entry_aliases=("Model",) if entry.kind == "model" else (),
        first_parameter=(lambda case: described[case.name].n_inputs) if entry.kind == "model" else None,
        reference_text=stripped,
        tpu=TUNED_FOR,
    )


def _shape(shape: tuple[int, ...], dtype: str) -> str:
    return f"[{', '.join(map(str, shape))}] {dtype}"


def _case_table(cases: list[Case], described: dict[str, Described]) -> dict[tuple, dict[str, Any]]:
    """What the shim needs per case, keyed by the shapes of kernel()'s arguments: the case's
    sizes (a workload reads CONFIG), and a model's init inputs and weight attributes."""
    table: dict[tuple, dict[str, Any]] = {}
    for case in cases:
        d = described[case.name]
        table[tuple(tuple(s) for s, _ in d.args)] = {
            "sizes": case.dims, "init": [_tuples(v) for v in d.init], "n_inputs": d.n_inputs,
            "weights": [n.removeprefix("self.") for n in d.names[d.n_inputs:]]}
    return table


def _tuples(value: Any) -> Any:
    """An init input back from JSON: KernelBench passes shapes and kernel sizes as tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def adapt_candidate(kind: str, table: dict[tuple, dict[str, Any]], source: str) -> AdaptedCandidate:
    """A candidate in the suite's format, made gradable: their harness dropped (and said so),
    and, unless it defines kernel() itself, a kernel() that calls its entry point. A KernelBench
    answer may rewrite the problem file whole, its `Model` doing the work (JAXBench's generated
    files do): without a `ModelNew`, that `Model` is the candidate's class."""
    stripped = strip_harness(source)
    notes = [f"dropped {what}" for what in stripped.removed]
    names = top_level_names(stripped.source)
    if "kernel" in names:
        return AdaptedCandidate(stripped.source, "", notes)
    accepted = ("workload",) if kind == "workload" else ("ModelNew", "Model")
    entry = next((name for name in accepted if name in names), None)
    if entry is None:
        raise CandidateFormatError(f"the module defines neither `{accepted[0]}` (this task's entry "
                                   "point) nor `kernel`")
    notes.append(f"added kernel(), which calls {entry}" if kind == "workload" else
                 f"added kernel(), which builds your {entry} and sets the reference's weights on it "
                 "(in your layout where it differs only by axes of size 1)")
    return AdaptedCandidate(stripped.source, _shim(kind, table, "CONFIG" in names, entry), notes)


def _shim(kind: str, table: dict[tuple, dict[str, Any]], has_config: bool, entry: str) -> str:
    """kernel() for a candidate in the suite's format. A workload may read CONFIG for its
    sizes (JAXBench's do), so CONFIG gets the traced case's sizes first. A model's weights are
    set in the layout its own __init__ chose when that differs from the reference's only by
    axes of size 1 (a (1, N) bias for an (N,) one): the same values, a layout a kernel's
    BlockSpec wants; any other difference is an error that names the weight."""
    header = "\n\n# Added by the grader: kernel() is its entry point; it calls yours.\n"
    key = "tuple(tuple(a.shape) for a in args)"
    if kind == "workload":
        if not has_config:
            return f"{header}def kernel(*args):\n    return {entry}(*args)\n"
        sizes_by_shapes = {k: v["sizes"] for k, v in table.items()}
        return (f"{header}_SIZES = {sizes_by_shapes!r}\n\n\ndef kernel(*args):\n"
                f"    CONFIG.update(_SIZES.get({key}, {{}}))\n    return {entry}(*args)\n")
    cases = {k: (v["init"], v["n_inputs"], v["weights"]) for k, v in table.items()}
    return (f"{header}_CASES = {cases!r}\n\n\n"
            "def _in_your_layout(model, name, value):\n"
            "    shape = getattr(getattr(model, name, None), 'shape', None)\n"
            "    if shape is None or tuple(shape) == tuple(value.shape):\n"
            "        return value\n"
            "    shape = tuple(shape)\n"
            "    if [d for d in shape if d != 1] == [d for d in value.shape if d != 1]:\n"
            "        return value.reshape(shape)\n"
            "    raise ValueError(f'weight {name!r}: the reference has shape {tuple(value.shape)}, '\n"
            "                     f'your {type(model).__name__}.__init__ makes it {shape}; the grader sets '\n"
            "                     'the reference\\'s values, so the layouts must agree (up to axes of size 1)')\n\n\n"
            "def kernel(*args):\n"
            f"    init, n_inputs, weights = _CASES[{key}]\n"
            f"    model = {entry}(*init)\n"
            "    for name, value in zip(weights, args[n_inputs:]):\n"
            "        setattr(model, name, _in_your_layout(model, name, value))\n"
            "    return model.forward(*args[:n_inputs])\n")
