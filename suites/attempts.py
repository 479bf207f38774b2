"""`check-suite jaxbench:PATH --attempts`: the model-written kernels of a JAXBench checkout
(`pallas_eval/generated/<model>/<group>/<file>.py`) graded by us, set beside the verdict
JAXBench's own harness reached on a real TPU v6e (`pallas_eval/results/eval_<model>.json`).

Where the two disagree, the row says why in words (`cause`): one of our work rules, their all-zero
inputs, their infrastructure, a JAX version difference, a truncated answer, or, when none of these
explains it, a suspected false reject or false accept of ours. The report is in
suites/attempts_report.py.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

GENERATED = Path("pallas_eval") / "generated"
RESULTS = Path("pallas_eval") / "results"
GENERATOR = Path("pallas_eval") / "generate.py"  # their script that asked the models for the kernels
PRIORITY_GROUP = "priority_kernels"
LEVEL_PREFIX = "jaxkernelbench_"

# Their failures that say nothing of the kernel: (pattern on their error text, what it was). Read
# off eval_gpt53.json and eval_gemini3.json at ebc95e6 and off their harness (pallas_eval/tpu.py:
# run_ssh answers "ERROR: Command timed out" or "ERROR: <exception>", scp_to_tpu raises "SCP failed").
INFRASTRUCTURE: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.M), label) for p, label in (
    (r"RESOURCE_EXHAUSTED: Error allocating device buffer",
     "HBM allocation failed at run time (a 6 GB buffer with 1.25 GB free: their harness held the rest)"),
    (r"RESOURCE_EXHAUSTED: Error loading program: Attempting to reserve",
     "HBM reservation failed when loading the program (RESOURCE_EXHAUSTED)"),
    (r"Unable to initialize backend 'tpu'", "TPU busy: the device was held by another process"),
    (r"^ERROR: Command timed out", "their ssh command timed out (300 s)"),
    (r"SCP failed", "scp of the files to the TPU host failed"),
    (r"^ERROR: |^No output$", "their ssh command failed or printed nothing"),
))
# Their error is a Pallas/Mosaic lowering failure in their JAX version.
THEIR_LOWERING = re.compile(r"Pallas TPU lowering|Mosaic failed to compile|pallas/mosaic/lowering\.py|"
                            r"Pallas encountered an internal verification error")
# Their harness imports the file as is: prose or a fence around the code is a SyntaxError there.
THEIR_SYNTAX = re.compile(r"^(invalid syntax|invalid decimal literal|unterminated string literal|unexpected indent|"
                          r"unmatched '|'.' was never closed|expected an indented block)")
# Our statuses that are a work rule or anti-cheat refusal rather than a wrong result.
RULE_STATUSES = frozenset({"no_kernel", "work_outside_kernel", "policy_violation", "missing_feature"})
TRUNCATED_STATUSES = frozenset({"extraction_error", "syntax_error"})
# A jax module member our jax lacks (pltpu.repeat, ...), as an AttributeError or ImportError names it.
JAX_MEMBER = re.compile(r"module '(jax[\w.]*)' has no attribute '(\w+)'|cannot import name '(\w+)' from '(jax[\w.]*)'")
NOT_LOADED = "not_loaded"
GRADING_FAILED = "grading_failed"  # the grading itself raised: not journaled, retried on a rerun


@dataclass(frozen=True)
class Theirs:
    """JAXBench's verdict on one attempt, classed correct / failed / infrastructure."""

    verdict: str
    status: str  # their record's status: success, or an error status
    message: str  # their error's first line, or their correctness_reason
    max_diff: float | None = None
    infrastructure: str = ""  # what the infrastructure failure was, when it was one
    lowering: bool = False  # their error is a Pallas/Mosaic lowering failure


@dataclass(frozen=True)
class Attempt:
    """One generated file, the task it answers and their record of it (None when they have none)."""

    model: str
    group: str  # jaxkernelbench_level1, jaxkernelbench_level2, priority_kernels
    path: Path
    task: str
    theirs: Theirs | None

    @property
    def key(self) -> str:
        return f"{self.model}/{self.group}/{self.path.name}"

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()


@dataclass
class Ours:
    """Our verdict on an attempt, as much of it as the report and the journal keep."""

    status: str
    message: str
    rel_l2: float | None = None
    error_type: str | None = None
    repaired: list[str] = field(default_factory=list)  # the task's inputs our loader redrew


def models(root: Path) -> list[str]:
    """The model folders under pallas_eval/generated, in name order."""
    folder = root / GENERATED
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


_TOKEN_LIMIT = re.compile(r"\bmax_(?:completion|output)_tokens\s*=\s*(\d+)")


def answer_token_limit(root: Path) -> int | None:
    """The output tokens their generation script allowed each answer (it passes
    `max_completion_tokens` / `max_output_tokens` to the model's API), when it names one figure."""
    path = root / GENERATOR
    limits = {int(v) for v in _TOKEN_LIMIT.findall(path.read_text(errors="replace"))} if path.is_file() else set()
    return limits.pop() if len(limits) == 1 else None


def task_name(group: str, stem: str) -> str | None:
    """Our task for a generated file, paired as their pallas_eval/evaluate.py pairs it."""
    if group.startswith(LEVEL_PREFIX):
        return f"kernelbench-jax/{group.removeprefix(LEVEL_PREFIX)}/{stem}"
    if group == PRIORITY_GROUP:
        return f"jaxbench-priority/{stem}"
    return None


def read_results(root: Path, model: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Their records for one model by (group, name); empty when they have no results file."""
    return records_by_key(root / RESULTS / f"eval_{model}.json")


def record_key(record: dict[str, Any]) -> tuple[str, str]:
    """(group, name) of a record of a results file: the folder and stem of its generated file."""
    group = PRIORITY_GROUP if record.get("suite") == PRIORITY_GROUP else f"{LEVEL_PREFIX}{record.get('level')}"
    return group, record.get("name", "")


def records_by_key(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """A results file's records (theirs, or benchmarks/jaxbench_timings.py's in the same shape) by
    (group, name); empty when there is no such file."""
    if not path.is_file():
        return {}
    return {record_key(r): r for r in json.loads(path.read_text()).get("results", [])}


def their_error(record: dict[str, Any]) -> str:
    """Their error text: the `error` field, else the traceback's last line (an AssertionError
    has an empty message)."""
    error = (record.get("error") or "").strip()
    if error:
        return error
    lines = [l for l in (record.get("traceback") or "").splitlines() if l.strip()]
    return lines[-1].strip() if lines else "(no error text)"


def classify(record: dict[str, Any]) -> Theirs:
    """Their record as correct, failed (the kernel's fault) or infrastructure (their run failed
    for reasons outside the kernel: see INFRASTRUCTURE)."""
    status = str(record.get("status", ""))
    if status == "success":
        verdict = "correct" if record.get("correct") else "failed"
        return Theirs(verdict, status, str(record.get("correctness_reason", "")), record.get("max_diff"))
    error = their_error(record)
    everything = f"{error}\n{record.get('traceback') or ''}"
    first = error.splitlines()[0] if error else ""
    for pattern, label in INFRASTRUCTURE:
        if pattern.search(error):
            return Theirs("infrastructure", status, first, infrastructure=label)
    return Theirs("failed", status, first, lowering=bool(THEIR_LOWERING.search(everything)))


def discover(root: Path, wanted: list[str] | None = None) -> list[Attempt]:
    """Every generated file of the wanted models (all when None), listed whether or not its task
    is in the checkout and whether or not they have a record of it."""
    attempts = []
    for model in wanted or models(root):
        records = read_results(root, model)
        for folder in sorted((root / GENERATED / model).glob("*/")):
            for path in sorted(folder.glob("*.py")):
                task = task_name(folder.name, path.stem)
                if task is None:
                    continue
                record = records.get((folder.name, path.stem))
                attempts.append(Attempt(model, folder.name, path, task,
                                        classify(record) if record is not None else None))
    return attempts


# --- the journal: one line per finished attempt, so a rerun grades only what is new --------------
class Journal:
    """Append-only JSONL of our verdicts, keyed by model/group/file, the file's sha256 and the
    grading settings; a partial last line (a killed run) is ignored."""

    def __init__(self, path: Path, settings: dict[str, Any]):
        self.path, self.settings = path, settings
        self._lock = threading.Lock()
        self.done: dict[tuple[str, str], Ours] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and entry.get("settings") == settings:
                    self.done[(entry["key"], entry["sha256"])] = Ours(**entry["ours"])

    def get(self, key: str, sha256: str) -> Ours | None:
        return self.done.get((key, sha256))

    def add(self, key: str, sha256: str, task: str, ours: Ours) -> None:
        line = json.dumps({"key": key, "sha256": sha256, "task": task, "settings": self.settings,
                           "status": ours.status, "ours": asdict(ours)})
        with self._lock:
            self.done[(key, sha256)] = ours
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(line + "\n")


# --- grading ------------------------------------------------------------------------------------
def ours_from_verdict(verdict: Any, repaired: list[str]) -> Ours:
    """The parts of a Verdict the report needs; rel_l2 is the worst case's relative L2 error."""
    errors = [c.rel_l2_err for c in verdict.cases if c.rel_l2_err is not None]
    return Ours(verdict.status, verdict.message, max(errors) if errors else None, verdict.error_type,
                list(repaired))


def grade(suite: Any, evaluator: Any, attempts: list[Attempt], journal: Journal, seed: int,
          workers: int = 2, on_done: Callable[[Attempt, Ours, bool], None] | None = None) -> dict[str, Ours]:
    """Our verdict per attempt key: from the journal where it is there, else graded (train split,
    the evaluator's seeds from `seed`) on `workers` threads. A task is loaded when first needed;
    `on_done(attempt, ours, graded_now)` after each."""
    from suites import LoadError

    results: dict[str, Ours] = {}
    pending = []
    for a in attempts:
        known = None if a.task in suite.entries else Ours(NOT_LOADED, f"no task: {a.task} is not in the checkout")
        known = known or journal.get(a.key, a.sha256())
        if known is None:
            pending.append(a)
            continue
        results[a.key] = known
        if on_done is not None:
            on_done(a, known, False)

    def one(a: Attempt) -> None:
        try:
            task = suite.task(a.task)
        except LoadError as exc:
            ours = Ours(NOT_LOADED, f"the task does not load: {exc}")
        else:
            try:
                verdict = evaluator.grade(task, a.text(), "train", seed)
            except Exception as exc:  # one bad grading must not end an hour-long run
                ours = Ours(GRADING_FAILED, f"the grading raised {type(exc).__name__}: {exc}")
            else:
                ours = ours_from_verdict(verdict, suite.loaded[a.task].repaired)
                journal.add(a.key, a.sha256(), a.task, ours)
        results[a.key] = ours
        if on_done is not None:
            on_done(a, ours, True)

    pending.sort(key=lambda a: (a.task, a.model))  # both models' answers to a task load it once
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, pending))
    return results
