"""Build a static leaderboard site from re-benchmark reports.

    python -m training.leaderboard runs/rebench/train/report.json runs/rebench/heldout/report.json --out site/

The site is plain files (index.html, its stylesheet and script, PNG figures, the reports it was
built from): open index.html from disk or copy the folder to any static host. Models are ranked by
mean pass@1 at the first answer on the train tasks, then on held-out shapes, then on held-out
tasks; every table sorts by any column. A model measured in several reports with the same settings
(say a train-split run and a held-out run) is one row. The report format is in
docs/report-format.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from training.rebench_report import GROUPS, REPORT_FORMAT, REPORT_FORMAT_VERSION, plot_turns, turn_curves

ASSETS = Path(__file__).parent / "site"
# What the headline columns read: (title, split, group).
HEADLINES = (("train tasks", "train", "train tasks"),
             ("held-out shapes", "heldout", "train tasks"),
             ("held-out tasks", "heldout", "held-out tasks"))
STATUS_COLORS = {"correct": "#2e7d32", "wrong_output": "#e53935", "runtime_error": "#fb8c00",
                 "wrong_shape": "#f4511e", "timeout": "#00acc1", "compile_error": "#5e35b1",
                 "lowering_error": "#3949ab", "missing_feature": "#00897b", "work_outside_kernel": "#6d4c41",
                 "no_kernel": "#757575", "import_error": "#c0ca33", "policy_violation": "#d81b60",
                 "syntax_error": "#fdd835", "extraction_error": "#bdbdbd", "grader_limit": "#90a4ae",
                 "unverified": "#ffcc80"}


class ReportError(ValueError):
    """A file that is not a readable re-benchmark report; the message is one line."""


@dataclass
class Entry:
    """One leaderboard row: a model measured with one set of settings, over one or more splits."""

    label: str
    model: dict[str, Any]
    settings: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)   # split -> result
    sources: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return int(self.settings["turns"])

    @property
    def fast_key(self) -> str:
        return f"fast_{float(self.settings.get('fast_p', 1.0)):g}"

    def group_turns(self, split: str, group: str) -> list[dict[str, Any]] | None:
        return self.results.get(split, {}).get("groups", {}).get(group, {}).get("turns")

    def headline(self, split: str, group: str, turn: int | None) -> float | None:
        """Mean pass@1 within `turn` turns (None: the last), or None where not measured."""
        rows = self.group_turns(split, group)
        if not rows:
            return None
        return rows[-1 if turn is None else turn - 1].get("pass@1")

    def fast(self, predicted: bool = False) -> float | None:
        """fast_p measured on a TPU, or (`predicted`) from the static prediction without one."""
        rows = self.group_turns("train", "all") or self.group_turns("heldout", "all")
        return rows[-1].get(f"predicted_{self.fast_key}" if predicted else self.fast_key) if rows else None

    def rank_key(self) -> tuple[float, ...]:
        return tuple(-1.0 if (v := self.headline(s, g, 1)) is None else v for _, s, g in HEADLINES)


def load_report(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReportError(f"report not found: {path}")
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path} is not JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise ReportError(f"{path} is not a rebench report (its \"format\" is not {REPORT_FORMAT!r}); "
                          "see docs/report-format.md")
    if report.get("format_version") != REPORT_FORMAT_VERSION:
        raise ReportError(f"{path} has format_version {report.get('format_version')!r}; this leaderboard "
                          f"reads version {REPORT_FORMAT_VERSION}")
    for key in ("settings", "models", "results"):
        if key not in report:
            raise ReportError(f"{path} has no {key!r}; see docs/report-format.md")
    return report


def entries_from(reports: list[tuple[str, dict[str, Any]]]) -> list[Entry]:
    """Rows from reports: one per (model, settings), its splits merged across reports."""
    rows: dict[tuple[str, str], Entry] = {}
    for name, report in reports:
        settings = report["settings"]
        same = json.dumps({k: v for k, v in settings.items() if k not in ("splits", "tasks")}, sort_keys=True)
        specs = {m["label"]: m for m in report["models"]}
        for label, splits in report["results"].items():
            entry = rows.setdefault((label, same), Entry(label, specs.get(label, {"label": label}), settings))
            for split, result in splits.items():
                if split in entry.results:
                    raise ReportError(f"{label!r} has two {split} results with the same settings "
                                      f"({', '.join(entry.sources)} and {name})")
                entry.results[split] = result
            entry.sources.append(name)
    entries = sorted(rows.values(), key=Entry.rank_key, reverse=True)
    labels = [e.label for e in entries]
    for e in entries:   # the same model under other settings: say which report each row is
        if labels.count(e.label) > 1:
            e.label = f"{e.label} ({', '.join(e.sources)})"
    return entries


# --- figures ------------------------------------------------------------------------------------

def plot_status_mix(entries: list[Entry], path: Path) -> bool:
    """Where the answers end up after each turn: one stacked bar per model and turn, per split.
    Returns False when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in ("train", "heldout") if any(s in e.results for e in entries)]
    if not splits:
        return False
    bars_per_split = sum(e.turns for e in entries)
    fig, axes = plt.subplots(len(splits), 1, figsize=(9, 1.2 + len(splits) * (0.6 + 0.28 * bars_per_split)),
                             squeeze=False)
    seen: dict[str, Any] = {}
    for ax, split in zip(axes[:, 0], splits):
        bars = [(f"{e.label} · t{t + 1}", row["statuses"]) for e in entries
                for t, row in enumerate(e.group_turns(split, "all") or [])]
        for y, (_, shares) in enumerate(reversed(bars)):
            left = 0.0
            for status in sorted(shares, key=lambda s: list(STATUS_COLORS).index(s) if s in STATUS_COLORS else 99):
                share, color = shares[status], STATUS_COLORS.get(status, "#9e9e9e")
                seen[status] = ax.barh(y, 100 * share, left=left, color=color, edgecolor="white", linewidth=0.5)
                left += 100 * share
        ax.set_yticks(range(len(bars)), [b[0] for b in reversed(bars)], fontsize=8)
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of conversations after t turns (%)", fontsize=8)
        ax.set_title(f"{split} split, all tasks", fontsize=9)
    fig.legend(seen.values(), seen.keys(), loc="lower center", ncol=min(5, len(seen)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 + 0.03 * (len(seen) > 5), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- the page -----------------------------------------------------------------------------------

def table_rows(entries: list[Entry], kind: str) -> list[dict[str, Any]]:
    """One row per split and entry of `results[split][kind]` ("tasks" or "levels"): per model,
    pass@1 at turn 1 and at the last turn; a task row also says its group and level."""
    keys = sorted({(split, name) for e in entries for split, r in e.results.items() for name in r[kind]},
                  key=lambda key: (key[0] != "train", key[1]))
    rows = []
    for split, name in keys:
        row: dict[str, Any] = {"split": split, "name": name, "cells": []}
        for e in entries:
            found = e.results.get(split, {}).get(kind, {}).get(name)
            if found and "group" in found:
                row["group"], row["level"] = found["group"], found["level"]
            turns = found["turns"] if found else None
            row["cells"].append((turns[0]["pass@1"], turns[-1]["pass@1"]) if turns else (None, None))
        rows.append(row)
    return rows


def render(entries: list[Entry], figures: dict[str, str], report_files: list[str]) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(ASSETS), autoescape=select_autoescape(["html", "j2"]))
    env.filters["pct"] = lambda v: "—" if v is None else f"{100 * v:.1f}%"
    env.filters["num"] = lambda v: "" if v is None else f"{v:.6g}"
    return env.get_template("index.html.j2").render(
        entries=entries, headlines=HEADLINES, tasks=table_rows(entries, "tasks"),
        levels=table_rows(entries, "levels"),
        figures=figures, reports=report_files, groups=GROUPS,
        built=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def build_site(report_paths: list[Path], out: Path) -> Path:
    """Write the site to `out`; returns the path of its index.html."""
    reports = [(p.name if [q.name for q in report_paths].count(p.name) == 1 else str(p), load_report(p))
               for p in report_paths]
    entries = entries_from(reports)
    if not entries:
        raise ReportError("the reports hold no results")
    out.mkdir(parents=True, exist_ok=True)
    for asset in ("style.css", "table-sort.js"):
        shutil.copyfile(ASSETS / asset, out / asset)
    (out / "reports").mkdir(exist_ok=True)
    report_files = []
    for i, path in enumerate(report_paths, 1):
        target = f"reports/{i}-{path.parent.name or 'report'}-{path.name}"
        shutil.copyfile(path, out / target)
        report_files.append(target)
    figures = {}
    results = {e.label: e.results for e in entries}
    panels = turn_curves(results)
    if panels:
        plot_turns(panels, out / "turns.png")
        figures["turns"] = "turns.png"
    if plot_status_mix(entries, out / "status_mix.png"):
        figures["status_mix"] = "status_mix.png"
    index = out / "index.html"
    index.write_text(render(entries, figures, report_files))
    return index


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.leaderboard", description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="+", type=Path, help="report.json files written by training.rebench")
    p.add_argument("--out", type=Path, default=Path("site"), help="folder for the site")
    args = p.parse_args(argv)
    try:
        index = build_site(args.reports, args.out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {index} (open it in a browser, or copy {args.out}/ to any static host)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
