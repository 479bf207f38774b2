"""`python -m evaluator check-suite jaxbench:PATH`: every workload and problem of a checkout,
loaded or why not, its sizes, its repaired inputs, and what the grader says of their own files.

Three gradings per loaded task, each a claim about the grader rather than about their code:
their baseline (plain JAX) must be refused as no_kernel; a Pallas kernel that writes zeros must
fail; their optimized.py, where there is one, is graded as any candidate would be.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from evaluator.grader import Evaluator, Job
from suites import LoadError, Suite
from suites.listing import EntryFacts
from tasks.spec import Task


@dataclass
class SuiteRow(EntryFacts):
    """An entry's facts (suites/listing.py) and the grader's verdicts on three files."""

    baseline: str = ""
    zeros: str = ""
    optimized: str = ""  # "" when the workload has no optimized.py
    optimized_message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def zeros_candidate(task: Task) -> str:
    """A Pallas kernel that writes zeros of the right shapes: the do-nothing answer that
    JAXBench's all-zero weights let pass. Written in our kernel() format, which every imported
    task also accepts."""
    table = {tuple(tuple(a.shape) for a in task.arg_specs(c)): [(list(o.shape), o.dtype) for o in task.out_specs(c)]
             for c in task.cases}
    return f'''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_OUTS = {table!r}


def _zero(o_ref):
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)


def kernel(*args):
    outs = [jax.ShapeDtypeStruct(tuple(s), d) for s, d in _OUTS[tuple(tuple(a.shape) for a in args)]]
    results = [pl.pallas_call(_zero, out_shape=o)() for o in outs]
    return results[0] if len(results) == 1 else tuple(results)
'''


def check_suite(suite: Suite, evaluator: Evaluator, names: list[str] | None = None,
                on_row: Callable[[SuiteRow], None] | None = None, seed: int = 0) -> list[SuiteRow]:
    """One row per entry, in name order; gradings run on the evaluator's workers."""
    rows = []
    for name in names or suite.names():
        rows.append(_row(suite, evaluator, name, seed))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _row(suite: Suite, evaluator: Evaluator, name: str, seed: int) -> SuiteRow:
    try:
        task = suite.task(name)
    except LoadError as exc:
        return SuiteRow(name, False, why_not=str(exc))
    loaded = suite.loaded[name]
    entry = suite.entry(name)
    check = task.select("train", "check")[0]
    bench = task.select("train", "bench")
    row = SuiteRow(name, True, check_sizes=check.dims, bench_sizes=bench[0].dims if bench else {},
                   heldout=loaded.heldout_kind, cap=loaded.cap,
                   counts_divided_by=loaded.counts_divided_by, hard_coded=loaded.hard_coded,
                   repaired=loaded.repaired, notes=loaded.notes)
    baseline = entry.path.read_text()
    if entry.kind == "model":  # a KernelBench problem file submitted as is: its Model is the ModelNew
        baseline = f"```python\n{baseline}\n\nModelNew = Model\n```"
    jobs = [Job(task, baseline, "train", seed), Job(task, zeros_candidate(task), "train", seed)]
    if entry.optimized is not None:
        jobs.append(Job(task, entry.optimized.read_text(), "train", seed))
    verdicts = evaluator.grade_many(jobs)
    row.baseline, row.zeros = verdicts[0].status, verdicts[1].status
    if entry.optimized is not None:
        row.optimized, row.optimized_message = verdicts[2].status, verdicts[2].message
    return row


def summary(rows: list[SuiteRow]) -> dict[str, Any]:
    """Counts per group (JAXBench workloads, level1, level2) and the grader's claims."""
    groups: dict[str, dict[str, int]] = {}
    for row in rows:
        group = "jaxbench" if row.name.startswith("jaxbench/") else row.name.rsplit("/", 1)[0]
        g = groups.setdefault(group, {"entries": 0, "loaded": 0})
        g["entries"] += 1
        g["loaded"] += row.loaded
    loaded = [r for r in rows if r.loaded]
    with_opt = [r for r in loaded if r.optimized]
    return {
        "groups": groups,
        "baselines_no_kernel": sum(r.baseline == "no_kernel" for r in loaded),
        "zeros_refused": sum(r.zeros != "correct" for r in loaded),
        "repaired": sum(bool(r.repaired) for r in loaded),
        "loaded": len(loaded),
        "optimized_correct": sum(r.optimized == "correct" for r in with_opt),
        "optimized": len(with_opt),
    }


def markdown(rows: list[SuiteRow]) -> str:
    """The rows as a Markdown table (check-suite --markdown)."""
    lines = ["| entry | loaded | check sizes | bench sizes | held-out | repaired | baseline | zeros | optimized.py |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loaded = "yes" if r.loaded else "no: " + " ".join(r.why_not.split())[:120].replace("|", "/")
        lines.append(f"| `{r.name}` | {loaded} | {_sizes(r.check_sizes)} | {_sizes(r.bench_sizes)} | "
                     f"{r.heldout} | {', '.join(r.repaired) or '-'} | {r.baseline or '-'} | {r.zeros or '-'} | "
                     f"{r.optimized or '-'} |")
    return "\n".join(lines)


def _sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def grader_lied(rows: list[SuiteRow]) -> list[str]:
    """Entries where the grader accepted what it must refuse: a plain-JAX baseline or zeros."""
    return [r.name for r in rows if r.loaded and (r.baseline == "correct" or r.zeros == "correct")]
