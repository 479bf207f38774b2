"""From verified pairs to a Hugging Face dataset: dedupe, decontaminate, balance, split, write, card.

The folder it writes (`datasets/<name>/`) loads with `datasets.load_dataset("datasets/<name>")`:
parquet files under data/, a README.md dataset card whose YAML header names the splits, and a
figure of the error-class distribution.
"""
from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from chat.prompts import describe_case
from data_gen.catalogue.kinds import mix_of, real_mix, total_variation
from data_gen.catalogue.mix import MAX_KIND_SHARE, TV_LIMIT, mix_table, semantic_share, target_mix
from data_gen.failures.fingerprint import fingerprint
from data_gen.failures.giveaways import (DATASET_RULES, MAX_ROWS_PER_EDIT, ROW_RULES, dataset_giveaways, masked_edit,
                                         row_giveaways, structure)
from data_gen.rows.text_rules import RULES, opening_share, prose, row_violations
from tasks import get_task
from tasks.spec import Task

T = TypeVar("T")


class ContaminationError(ValueError):
    """A row would leak held-out material into training data."""


def heldout_markers(task: Task) -> list[str]:
    """Text that only a held-out case of `task` would put in a prompt (its shape lines)."""
    train = {describe_case(task, c) for c in task.select("train")}
    return [line for c in task.select("heldout") if (line := describe_case(task, c)) not in train]


def check_clean(row: dict, task_of: Callable[[str], Task] = get_task) -> None:
    """Raise if a row touches a held-out task or case: the dataset must never contain one.
    `task_of` finds the row's task (a peer suite's, for rows from its checkout)."""
    task = task_of(row["task"])
    if task.heldout_task:
        raise ContaminationError(f"row {row['id']}: task {task.name} is held out")
    if row["case_split"] != "train":
        raise ContaminationError(f"row {row['id']}: graded on split {row['case_split']!r}, not train")
    text = "\n".join(m["content"] for m in row["messages"])
    for marker in heldout_markers(task):
        if marker in text:
            raise ContaminationError(f"row {row['id']}: shows held-out case {marker.strip()}")
    for name in _heldout_task_names():
        if f"`{name}`" in text:
            raise ContaminationError(f"row {row['id']}: names held-out task {name}")


def _heldout_task_names() -> list[str]:
    from tasks import all_tasks

    return [t.name for t in all_tasks() if t.heldout_task]


def dedupe(rows: Iterable[dict]) -> list[dict]:
    """Keep the first row of each (task, failing kernel, context): kernels equal up to comments,
    layout and identifier names (`fingerprint`) are one failing kernel, whatever their repair."""
    seen, out = set(), []
    for row in rows:
        key = (row["task"], fingerprint(row["failing_code"]), row["context"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def cap_per_repair(rows: list[dict], cap: int) -> list[dict]:
    """At most `cap` rows per repair kernel (by `fingerprint`), chosen round-robin over error
    classes: without a cap, one repair behind many pairs is what a model learns by heart.
    cap <= 0 keeps everything."""
    return _capped(rows, cap, lambda r: (r["task"], fingerprint(r["repair_code"])), lambda r: r["error_class"])


def balance(rows: list[dict], cap: int) -> list[dict]:
    """At most `cap` rows per (task, failure kind), chosen round-robin over origins (bug operators
    or models) so a capped cell keeps its variety. cap <= 0 keeps everything."""
    return _capped(rows, cap, lambda r: (r["task"], r["failure_kind"]), lambda r: r["origin"])


def _capped(rows: list[dict], cap: int, group: Callable[[dict], Hashable],
            spread: Callable[[dict], Hashable]) -> list[dict]:
    """At most `cap` rows per group, taken round-robin over the values of `spread` within the
    group; the rows keep their order."""
    if cap <= 0:
        return rows
    groups: dict[Hashable, dict[Hashable, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        groups[group(row)][spread(row)].append(row)
    kept = [r for queues in groups.values() for r in round_robin(list(queues.values()), cap)]
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(kept, key=lambda r: order[id(r)])


def cap_per_edit(rows: list[dict], cap: int = MAX_ROWS_PER_EDIT) -> list[dict]:
    """At most `cap` rows per (task, edit from failing to repair with numbers masked), chosen
    round-robin over repair kernels: the same edit in the same task teaches one thing."""
    return _capped(rows, cap, lambda r: (r["task"], masked_edit(r["failing_code"], r["repair_code"])),
                   lambda r: fingerprint(r["repair_code"]))


def calibrate(rows: list[dict], kind_of: Callable[[dict], str], spread: Callable[[dict], Hashable]) -> list[dict]:
    """The largest subset of `rows` whose mix by kind is within TV_LIMIT of the real mix and has
    no kind above MAX_KIND_SHARE, taking each kind's rows round-robin over `spread` (say, the
    task and the repair's structure) so a trimmed kind keeps its variety. Rows keep their order. When no subset meets both (a
    run over a few tasks), each kind is trimmed to its target share of all the rows, and the
    card shows how far that mix is from the real one."""
    target = target_mix()
    by_kind: dict[str, dict[Hashable, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_kind[kind_of(row)][spread(row)].append(row)
    available = {k: sum(map(len, groups.values())) for k, groups in by_kind.items()}


    def counts_for(total: int) -> Counter[str]:
        return Counter({k: min(n, max(1, round(target.get(k, 0.0) * total))) for k, n in available.items()
                        if k in target})

    best = counts_for(len(rows))
    for total in range(len(rows), 0, -1):
        counts = counts_for(total)
        kept = sum(counts.values())
        if kept and max(counts.values()) <= MAX_KIND_SHARE * kept and \
                total_variation(mix_of(counts), real_mix()) <= TV_LIMIT:
            best = counts
            break
    sizes = Counter(_lead(spread(row)) for row in rows)
    kept_rows = [r for k, groups in by_kind.items() for r in round_robin(_interleaved(groups, sizes), best[k])
                 if best[k] > 0]
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(kept_rows, key=lambda r: order[id(r)])


def _interleaved(groups: dict[Hashable, list[dict]], sizes: Counter[Hashable]) -> list[list[dict]]:
    """The groups, the first group of every leading key (a task, in a (task, structure) spread)
    before the second of any, and among firsts the keys with the fewest rows in all (`sizes`)
    first: a kind trimmed to fewer rows than it has groups keeps the tasks that have little
    else, not the tasks that happen to come first."""
    seen: Counter[Hashable] = Counter()
    ranked = []
    for index, (key, rows) in enumerate(groups.items()):
        lead = _lead(key)
        ranked.append((seen[lead], sizes[lead], index, rows))
        seen[lead] += 1
    return [rows for *_, rows in sorted(ranked, key=lambda x: x[:3])]


def _lead(key: Hashable) -> Hashable:
    return key[0] if isinstance(key, tuple) else key


def round_robin(queues: list[list[T]], limit: int) -> list[T]:
    """One item from each queue in turn until `limit` items are taken (limit <= 0: all of them)."""
    queues = [list(q) for q in queues]
    taken: list[T] = []
    while any(queues) and (limit <= 0 or len(taken) < limit):
        for queue in queues:
            if queue and (limit <= 0 or len(taken) < limit):
                taken.append(queue.pop(0))
    return taken


# Failure kinds whose rows all go to validation, never to train: a validation loss on kinds the
# model never saw repaired measures transfer, not recall of a template. Both are static kinds of
# real failures with their own error text and fix (data_gen/catalogue/kinds.py).
VALIDATION_KINDS = ("spec_arity", "captured_constant")


def in_validation(row: dict, val_tasks: set[str]) -> bool:
    return row["task"] in val_tasks or row.get("failure_kind") in VALIDATION_KINDS


def validation_tasks(tasks: list[str], fraction: float) -> set[str]:
    """A fixed, seed-free choice of whole tasks for validation (they are unseen in train)."""
    if fraction <= 0 or len(tasks) < 2:
        return set()
    count = min(len(tasks) - 1, max(1, round(fraction * len(tasks))))
    ranked = sorted(tasks, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    return set(ranked[:count])


@dataclass
class Diversity:
    """How many different kernels a dataset teaches (kernels counted by `fingerprint`)."""

    pairs: int
    distinct_repairs: int
    repair_structures: int  # distinct repairs once numbers are masked too (`giveaways.structure`)
    distinct_failing: int
    max_pairs_per_repair: int
    mean_pairs_per_repair: float
    repairs_per_task: dict[str, int]

    @classmethod
    def of(cls, rows: list[dict]) -> "Diversity":
        per_repair = Counter((r["task"], fingerprint(r["repair_code"])) for r in rows)
        failing = {(r["task"], fingerprint(r["failing_code"])) for r in rows}
        per_task = Counter(task for task, _ in per_repair)
        structures = {(r["task"], structure(r["repair_code"])) for r in rows}
        return cls(len(rows), len(per_repair), len(structures), len(failing), max(per_repair.values(), default=0),
                   round(len(rows) / max(1, len(per_repair)), 2), dict(sorted(per_task.items())))

    def table(self) -> str:
        return "\n".join([
            "| measure | value |", "|---|---:|",
            f"| pairs | {self.pairs} |",
            f"| distinct repair kernels | {self.distinct_repairs} |",
            f"| distinct repair structures (numbers masked too) | {self.repair_structures} |",
            f"| pairs per repair kernel (max / mean) | {self.max_pairs_per_repair} / {self.mean_pairs_per_repair} |",
            f"| distinct failing kernels | {self.distinct_failing} |",
            f"| tasks | {len(self.repairs_per_task)} |",
        ])


@dataclass
class RuleCounts:
    """How many rows break each text rule, and how alike the explanations start."""

    rows: int
    broken: dict[str, int]
    top_opening: str
    top_opening_share: float

    giveaways: dict[str, int]

    @classmethod
    def of(cls, rows: list[dict]) -> "RuleCounts":
        rows = [r for r in rows if len(r["messages"]) == 5]
        broken = Counter(rule for r in rows for rule in row_violations(r))
        top, share = opening_share(prose(r["messages"][4]["content"]) for r in rows)
        given = Counter(rule for r in rows if r["source"] == "mutation"
                        for rule in row_giveaways(r["failing_code"], r["repair_code"]))
        given.update(dataset_giveaways(rows, lambda r: r.get("failure_kind", ""), MAX_KIND_SHARE))
        return cls(len(rows), {rule: broken[rule] for rule in RULES}, top, round(share, 4),
                   {rule: given[rule] for rule in ROW_RULES + DATASET_RULES})

    def table(self) -> str:
        lines = ["| rule | rows breaking it |", "|---|---:|"]
        lines += [f"| {rule} | {n} |" for rule, n in self.broken.items()]
        lines += [f"| giveaway: {rule} | {n} |" for rule, n in self.giveaways.items()]
        lines.append(f"| most common opening (first 8 words, code and numbers masked): \"{self.top_opening}\" | "
                     f"{100 * self.top_opening_share:.1f}% of {self.rows} rows |")
        return "\n".join(lines)


@dataclass
class DatasetSummary:
    path: Path
    splits: dict[str, int]
    by_task: Counter
    by_error_class: Counter
    by_source: Counter
    by_origin: Counter
    by_kind: Counter
    diversity: Diversity
    rules: RuleCounts
    level_of: dict[str, int]  # task -> its level (1-3)


def write_dataset(rows: list[dict], out_dir: Path, name: str, validation_fraction: float,
                  description: str, *, task_of: Callable[[str], Task] = get_task, sections: str = "",
                  license: str = "apache-2.0") -> DatasetSummary:
    """Write parquet splits, the card and the figure; return the counts the card states.
    `sections` is Markdown the card carries after its summary (a real-failure run's yield)."""
    import datasets

    datasets.disable_progress_bars()
    for row in rows:
        check_clean(row, task_of)
    val = validation_tasks(sorted({r["task"] for r in rows}), validation_fraction)
    splits = {"train": [r for r in rows if not in_validation(r, val)],
              "validation": [r for r in rows if in_validation(r, val)]}
    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    for old in data_dir.glob("*.parquet"):
        old.unlink()
    for split, split_rows in splits.items():
        if split_rows:
            datasets.Dataset.from_list(split_rows).to_parquet(data_dir / f"{split}-00000-of-00001.parquet")
    summary = DatasetSummary(
        out_dir, {s: len(r) for s, r in splits.items()}, Counter(r["task"] for r in rows),
        Counter(r["error_class"] for r in rows), Counter(r["source"] for r in rows),
        Counter(r["origin"] for r in rows), Counter(r.get("failure_kind", "") for r in rows), Diversity.of(rows),
        RuleCounts.of(rows), {r["task"]: r["level"] for r in rows})
    _plot_error_classes(summary, out_dir / "error_classes.png")
    (out_dir / "README.md").write_text(dataset_card(summary, name, description, sorted(val), sections, license))
    return summary


def _plot_error_classes(summary: DatasetSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = summary.by_error_class.most_common()
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(classes) + 1.2))
    ax.barh([c for c, _ in classes][::-1], [n for _, n in classes][::-1], color="#4c72b0")
    ax.set_xlabel("pairs")
    ax.set_title("Fixit pairs by error class of the failing kernel")
    for i, (_, n) in enumerate(classes[::-1]):
        ax.text(n, i, f" {n}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(counter: Counter, header: str) -> str:
    lines = [f"| {header} | pairs |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines)


def _task_table(summary: DatasetSummary) -> str:
    """Pairs per level, then per task with its level."""
    by_level = Counter()
    for task, n in summary.by_task.items():
        by_level[summary.level_of[task]] += n
    lines = ["| level | tasks | pairs |", "|---:|---:|---:|"]
    lines += [f"| {level} | {sum(summary.level_of[t] == level for t in summary.by_task)} | {n} |"
              for level, n in sorted(by_level.items())]
    lines += ["", "| task | level | pairs | distinct repair kernels |", "|---|---:|---:|---:|"]
    lines += [f"| {task} | {summary.level_of[task]} | {n} | {summary.diversity.repairs_per_task.get(task, 0)} |"
              for task, n in sorted(summary.by_task.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines)


def dataset_card(summary: DatasetSummary, name: str, description: str, val_tasks: list[str], sections: str = "",
                 license: str = "apache-2.0") -> str:
    # No `configs:` block: with one, `datasets` keys its cache on the file patterns, so a rewritten
    # folder (a rerun, or another dataset of the same name) loads stale rows. Without it, the
    # splits come from the file names (data/train-*, data/validation-*) and the cache key from
    # the files themselves.
    from huggingface_hub import DatasetCardData

    header = DatasetCardData(license=license, task_categories=["text-generation"],
                             tags=["code", "jax", "pallas", "tpu", "kernels"]).to_yaml()
    total = sum(summary.splits.values())
    extra = f"{sections.rstrip()}\n\n" if sections else ""
    return f"""---
{header}
---

# {name}: Fixit repair pairs for Pallas TPU kernels

{description}

Each row is a five-message conversation (`messages`): system prompt, task prompt, a failing
kernel, the evaluator's feedback on it, and the repair (an explanation, then the corrected kernel).
Train only on the last message. The evaluator confirmed every pair: the failing kernel fails, and
the repaired kernel passes every train case under `tpu-interpret` and lowers for TPU.

- {total} pairs: {', '.join(f'{n} {s}' for s, n in summary.splits.items())}.
- Validation holds whole tasks that train does not have ({', '.join(val_tasks) or 'none'}) and every
  row of the failure kinds train never sees ({', '.join(f'`{k}`' for k in VALIDATION_KINDS)}): its loss
  measures transfer to new tasks and new kinds of failure, not recall of a template.
- Decontaminated: no held-out task and no held-out case appears in any row (checked on write).
- Deduplicated on the failing kernel; capped per repair kernel, per task x failure kind and per
  task x edit (numbers masked, at most {MAX_ROWS_PER_EDIT}). Kernels are compared after normalising
  comments, docstrings, whitespace and identifier names.
- Every explanation's fix is proven: it states the edit from the failing kernel to the repair
  in the row, and the repair is graded correct on every train case.

Columns: `id`, `attempt_id`, `task`, `task_version`, `level`, `case_split`, `error_class` (the failing
kernel's verdict status), `failure_kind` (its kind in the failure catalogue, `data_gen/catalogue/kinds.py`),
`failing_stage`, `source` (mutation / model / replay / jaxbench), `origin` (bug operator
or the model whose attempt failed), `context` (hardware context in the system prompt), `messages`, `failing_verdict` and
`repair_verdict` (evaluator verdicts as JSON), `failing_code`, `repair_code`, `repaired_by` (what wrote
the repair: the seed kernel a bug was injected into, `search: <repairers>` for the catalogue's
repairers, `model: <name>` for a model, `given` for a replayed row's own).

```python
import datasets
ds = datasets.load_dataset("datasets/{name}")
```

{extra}## Diversity

{summary.diversity.table()}

## Error classes

![error classes](error_classes.png)

{_table(summary.by_error_class, "error class")}

## The mix beside the real one

Failure kinds of this dataset's rows and of GPT-5.3's real one-shot failures on JAXBench, both
counted by the failure catalogue (`data_gen/catalogue/kinds.py`) from their error texts. The runtime
kinds (wrong values, out-of-bounds reads, races) read as one group here: a real TPU reports all
three as wrong output. The target mix and its departures from the real one are stated in
`data_gen/catalogue/mix.py`: no kind above {100 * MAX_KIND_SHARE:.0f}% of the rows, the runtime kinds at about
20% (a repair loop meets them once a kernel compiles, and their feedback does not name the fix),
and a few percent of answers that never reach the compiler (prose in the code, a wrong entry
point), which Gemini 3 makes and GPT-5.3 does not.

{mix_table(summary.by_kind)}

{100 * semantic_share(summary.by_kind):.1f}% of rows are in the runtime kinds.

## Failure kinds

{_table(summary.by_kind, "failure kind")}

## Explanation and giveaway rules

Every explanation is checked (`data_gen/rows/text_rules.py`) and a pair that breaks a rule is not
kept: no local path or seed in the feedback or the explanation, no evaluator stage names, no
history verbs (became, was removed, no longer), no 8-word run copied from the feedback, no
names of code the failing kernel does not contain. Nor may the failing kernel and its repair
differ beyond the fix (`data_gen/failures/giveaways.py`): comments and docstrings differ only on the
lines the fix changes, the failing kernel leaves no name unread and assigns nothing to itself;
and over the dataset no kind holds more than {100 * MAX_KIND_SHARE:.0f}% of the rows and no edit
repeats more than {MAX_ROWS_PER_EDIT} times in one task.

{summary.rules.table()}

## Sources

{_table(summary.by_source, "source")}

## Origins (bug operators or models)

{_table(summary.by_origin, "origin")}

## Tasks

{_task_table(summary)}

Made by `python -m data_gen.collect` (see docs/data-generation.md).
"""
