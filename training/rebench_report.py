"""What a re-benchmark reports: per-turn pass@k, status mix and fast_p, per task, level and group.

The report format (`report.json`) is documented in docs/report-format.md; `training.leaderboard`
reads it, and so can anyone who wants to submit results. A sample is one conversation of up to
`turns` answers; it succeeds within t turns when one of its first t answers is correct. "After t
turns" a sample's status is that of its latest answer among the first t (a sample that stopped
early, because it was correct, keeps its last status).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from training.metrics import fast_p, pass_at_k, status_shares

REPORT_FORMAT = "pallas-kernel-gym/rebench-report"
REPORT_FORMAT_VERSION = 2
GROUPS = ("train tasks", "held-out tasks")


@dataclass
class Turn:
    """One answer of a conversation and the evaluator's verdict on it."""

    turn: int
    status: str
    speedup: float | None
    message: str
    answer: str
    # Static, without a TPU (evaluator/performance/prediction.py): the verdict's predicted_speedup.
    predicted_speedup: float | None = None


@dataclass
class Sample:
    """One conversation: a model asked for a task's kernel, then repairing it from feedback."""

    model: str
    task: str
    group: str   # "train tasks" or "held-out tasks"
    level: int
    split: str   # the cases shown in the prompt, graded and fed back
    index: int
    turns: list[Turn] = field(default_factory=list)

    def correct_within(self, t: int) -> bool:
        return any(turn.status == "correct" for turn in self.turns[:t])

    def after(self, t: int) -> Turn:
        """The latest answer among the first t."""
        return self.turns[min(t, len(self.turns)) - 1]

    def record(self) -> dict[str, Any]:
        """A samples.jsonl row: the last answer's status and code up front (what
        `training.generalization` reads), every turn after."""
        last = self.turns[-1]
        return {"model": self.model, "task": self.task, "group": self.group, "level": self.level,
                "split": self.split, "index": self.index, "status": last.status, "speedup": last.speedup,
                "answer": last.answer, "turns": [vars(t) for t in self.turns]}


def turn_rows(samples: list[Sample], ks: list[int], turns: int, p: float) -> list[dict[str, Any]]:
    """One task's figures at each turn t = 1..turns."""
    n = len(samples)
    rows = []
    for t in range(1, turns + 1):
        c = sum(s.correct_within(t) for s in samples)
        last = [s.after(t) for s in samples]
        rows.append({"turn": t, "n": n, "asked": sum(len(s.turns) >= t for s in samples), "correct": c,
                     **{f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n},
                     f"fast_{p:g}": fast_p([x.status for x in last], [x.speedup for x in last], p),
                     f"predicted_fast_{p:g}": fast_p([x.status for x in last], [x.predicted_speedup for x in last], p),
                     "statuses": status_shares([x.status for x in last])})
    return rows


def mean_rows(per_task: list[list[dict[str, Any]]], ks: list[int], p: float) -> list[dict[str, Any]]:
    """Means over tasks, turn by turn: each task weighs the same. fast_p is the mean over the
    tasks that were timed, null when none was."""
    out = []
    for rows in zip(*per_task):
        statuses: dict[str, float] = defaultdict(float)
        for row in rows:
            for status, share in row["statuses"].items():
                statuses[status] += share / len(rows)
        timed = [r[f"fast_{p:g}"] for r in rows if r[f"fast_{p:g}"] is not None]
        predicted = [r[f"predicted_fast_{p:g}"] for r in rows if r.get(f"predicted_fast_{p:g}") is not None]
        out.append({"turn": rows[0]["turn"], "tasks": len(rows),
                    **{f"pass@{k}": sum(r[f"pass@{k}"] for r in rows) / len(rows)
                       for k in ks if all(f"pass@{k}" in r for r in rows)},
                    f"fast_{p:g}": sum(timed) / len(timed) if timed else None,
                    f"predicted_fast_{p:g}": sum(predicted) / len(predicted) if predicted else None,
                    "statuses": dict(sorted(statuses.items(), key=lambda kv: -kv[1]))})
    return out


def summarize(samples: list[Sample], ks: list[int], turns: int, p: float) -> dict[str, Any]:
    """results[model][split] = {"tasks", "levels", "groups"}; groups include "all"."""
    by_key: dict[tuple[str, str], dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_key[(s.model, s.split)][s.task].append(s)
    results: dict[str, Any] = defaultdict(dict)
    for (model, split), per_task in by_key.items():
        tasks = {task: {"group": group[0].group, "level": group[0].level,
                        "turns": turn_rows(group, ks, turns, p)}
                 for task, group in sorted(per_task.items())}
        levels = {str(level): {"turns": mean_rows([r["turns"] for r in tasks.values() if r["level"] == level],
                                                  ks, p)}
                  for level in sorted({r["level"] for r in tasks.values()})}
        groups = {g: {"turns": mean_rows([r["turns"] for r in tasks.values() if g in ("all", r["group"])], ks, p)}
                  for g in [*GROUPS, "all"] if any(g in ("all", r["group"]) for r in tasks.values())}
        results[model][split] = {"tasks": tasks, "levels": levels, "groups": groups}
    return dict(results)


def report_document(settings: dict[str, Any], models: list[dict[str, Any]], results: dict[str, Any]
                    ) -> dict[str, Any]:
    """report.json as written (docs/report-format.md)."""
    return {"format": REPORT_FORMAT, "format_version": REPORT_FORMAT_VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "settings": settings, "models": models, "results": results}


# --- tables -------------------------------------------------------------------------------------

def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def markdown(results: dict[str, Any], ks: list[int], turns: int) -> str:
    """Per split: pass@1 within each turn per task, then every pass@k per group and level."""
    models = list(results)
    out = []
    for split in sorted({s for m in models for s in results[m]}, key=lambda s: s != "train"):
        out.append(f"## {split} split\n")
        head = [f"{m} {'t' if t == 1 else '<=t'}{t}" for m in models for t in range(1, turns + 1)]
        out.append("pass@1 within t turns\n")
        out.append("| task | level | group | " + " | ".join(head) + " |")
        out.append("|---|---:|---|" + "---:|" * len(head))
        tasks = sorted({t for m in models for t in results[m].get(split, {}).get("tasks", {})})
        for task in tasks:
            some = next(results[m][split]["tasks"][task] for m in models if task in results[m].get(split, {})
                        .get("tasks", {}))
            cells = [pct(_at(results[m].get(split, {}).get("tasks", {}).get(task), t, "pass@1"))
                     for m in models for t in range(1, turns + 1)]
            out.append(f"| {task} | {some['level']} | {some['group']} | " + " | ".join(cells) + " |")
        out.append("")
        head = [f"{m} pass@{k} {'t' if t == 1 else '<=t'}{t}" for m in models for k in ks
                for t in range(1, turns + 1)]
        out.append("| mean over tasks | " + " | ".join(head) + " |")
        out.append("|---|" + "---:|" * len(head))
        for kind, label in (("groups", "{}"), ("levels", "level {}")):
            names = sorted({g for m in models for g in results[m].get(split, {}).get(kind, {})},
                           key=lambda g: ([*GROUPS, "all"].index(g) if g in (*GROUPS, "all") else 9, g))
            for name in names:
                cells = [pct(_at(results[m].get(split, {}).get(kind, {}).get(name), t, f"pass@{k}"))
                         for m in models for k in ks for t in range(1, turns + 1)]
                out.append(f"| **{label.format(name)}** | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _at(entry: dict[str, Any] | None, turn: int, key: str) -> float | None:
    if not entry or len(entry["turns"]) < turn:
        return None
    return entry["turns"][turn - 1].get(key)


# --- figures ------------------------------------------------------------------------------------

def turn_curves(results: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """panel ("<split> split, <group>") -> model -> mean pass@1 within t turns, t = 1.."""
    panels: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for model, splits in results.items():
        for split, result in sorted(splits.items(), key=lambda kv: kv[0] != "train"):
            for group in GROUPS:
                if group in result["groups"]:
                    panels[f"{split} split, {group}"][model] = [r["pass@1"] for r in result["groups"][group]["turns"]]
    return dict(panels)


def plot_turns(panels: dict[str, dict[str, list[float]]], path: Path) -> None:
    """Success against turns, one line per model, one panel per split and task group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(0.6 + 3.6 * len(panels), 3.4), squeeze=False,
                             sharey=True)
    models = list(dict.fromkeys(m for curves in panels.values() for m in curves))  # one color per model
    for ax, (title, curves) in zip(axes[0], panels.items()):
        for model, values in curves.items():
            turns = range(1, len(values) + 1)
            ax.plot(turns, [100 * v for v in values], marker="o", label=model, color=f"C{models.index(model) % 10}")
        longest = max(len(v) for v in curves.values())
        ax.set_xticks(range(1, longest + 1))
        ax.set_xlabel("turns (answers)")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@1 within t turns (%)")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
