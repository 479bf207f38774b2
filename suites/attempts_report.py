"""The agreement report of `check-suite --attempts`: per model, our verdict beside JAXBench's on
each generated kernel, counted, and every disagreement with its cause in words (suites/attempts.py
grades and classes).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from suites.attempts import (GRADING_FAILED, JAX_MEMBER, NOT_LOADED, RULE_STATUSES, THEIR_SYNTAX,
                             TRUNCATED_STATUSES, Attempt, Ours, Theirs)

OUTCOMES = ("both_correct", "both_failed", "they_correct_we_failed", "they_failed_we_correct",
            "their_infrastructure", "not_loaded", "no_record")
LABELS = {"both_correct": "both correct", "both_failed": "both failed",
          "they_correct_we_failed": "they correct, we failed", "they_failed_we_correct": "they failed, we correct",
          "their_infrastructure": "their infrastructure", "not_loaded": "not loaded (ours)",
          "no_record": "no record of theirs"}
DISAGREEMENTS = ("they_correct_we_failed", "they_failed_we_correct", "their_infrastructure")


@dataclass
class AttemptRow:
    """One generated file: their verdict, ours, how they compare and why they differ."""

    model: str
    group: str
    file: str
    task: str
    theirs: Theirs | None
    ours: Ours
    outcome: str
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_line(text: str) -> str:
    return next((l.strip() for l in text.splitlines() if l.strip()), "")


def outcome(theirs: Theirs | None, ours: Ours) -> str:
    if ours.status in (NOT_LOADED, GRADING_FAILED):
        return "not_loaded"
    if theirs is None:
        return "no_record"
    if theirs.verdict == "infrastructure":
        return "their_infrastructure"
    we = ours.status == "correct"
    if theirs.verdict == "correct":
        return "both_correct" if we else "they_correct_we_failed"
    return "they_failed_we_correct" if we else "both_failed"


def jax_member(ours: Ours) -> str | None:
    """The jax module member our jax lacks, when that is why our grading failed."""
    if ours.error_type not in (None, "AttributeError", "ImportError", "ModuleNotFoundError"):
        return None
    m = JAX_MEMBER.search(ours.message)
    if m is None:
        return None
    module, member = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
    return f"{module}.{member}"


def _both(theirs: Theirs, ours: Ours) -> str:
    return f"theirs: {theirs.message or theirs.status}; ours: {first_line(ours.message)}"


def _why_we_failed(theirs: Theirs, ours: Ours) -> str:
    """Why we failed an attempt they did not fail for the kernel's sake."""
    if ours.status in RULE_STATUSES:
        return f"our work rule ({ours.status}): {first_line(ours.message)}"
    if ours.status == "grader_limit":
        return f"our grader's limit: {first_line(ours.message)}"
    if ours.status == "timeout":
        return (f"our grader's time limit: interpret mode costs milliseconds per grid step, and a kernel "
                f"of small blocks runs thousands of them ({first_line(ours.message)})")
    member = jax_member(ours)
    if member is not None:
        return f"JAX version difference: {member} is missing in our jax ({first_line(ours.message)})"
    if theirs.verdict == "correct" and ours.status == "wrong_output" and ours.repaired:
        return (f"their all-zero inputs: our loader redrew {', '.join(ours.repaired)}, on which the "
                f"kernel is wrong (rel L2 {ours.rel_l2:.3g})" if ours.rel_l2 is not None else
                f"their all-zero inputs: our loader redrew {', '.join(ours.repaired)}")
    return f"false reject of ours? {_both(theirs, ours)}"


def cause(theirs: Theirs | None, ours: Ours) -> str:
    """The cause of a disagreement in words; for rows that agree, only a truncated answer is named."""
    kind = outcome(theirs, ours)
    if kind in ("not_loaded", "no_record", "both_correct") or theirs is None:
        return first_line(ours.message) if kind == "not_loaded" else ""
    if kind == "their_infrastructure":
        return f"their infrastructure failure: {theirs.infrastructure}; ours: {first_line(ours.message)}"
    if kind == "both_failed":
        if ours.status in TRUNCATED_STATUSES:
            return f"truncated answer: {first_line(ours.message)} (theirs: {theirs.message})"
        return ""
    if kind == "they_correct_we_failed":
        return _why_we_failed(theirs, ours)
    if theirs.lowering:
        return f"JAX version difference (unconfirmed): it failed to lower in their JAX, it lowers in ours ({theirs.message})"
    if THEIR_SYNTAX.match(theirs.message):
        return f"their harness imports the file as is (SyntaxError: {theirs.message}); we extracted its code"
    return f"false accept of ours? {_both(theirs, ours)}"


def rows(attempts: list[Attempt], ours: dict[str, Ours]) -> list[AttemptRow]:
    """One row per attempt that has a verdict of ours, in the attempts' order."""
    out = []
    for a in attempts:
        if a.key in ours:
            o = ours[a.key]
            out.append(AttemptRow(a.model, a.group, a.path.name, a.task, a.theirs, o,
                                  outcome(a.theirs, o), cause(a.theirs, o)))
    return out


def summary(rows: list[AttemptRow]) -> dict[str, dict[str, int]]:
    """Counts of each outcome, per model."""
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        counts.setdefault(r.model, dict.fromkeys(OUTCOMES, 0))[r.outcome] += 1
    return counts


def disagreements(rows: list[AttemptRow]) -> list[AttemptRow]:
    """The rows where the verdicts differ, and the failures both agree on that have a cause
    worth naming (a truncated answer), by outcome."""
    listed = [r for r in rows if r.outcome in DISAGREEMENTS or (r.outcome == "both_failed" and r.cause)]
    return sorted(listed, key=lambda r: OUTCOMES.index(r.outcome))


def to_json(rows: list[AttemptRow], generation: str) -> dict[str, Any]:
    return {"generation": generation, "summary": summary(rows),
            "models": {m: [r.to_dict() for r in rows if r.model == m] for m in summary(rows)}}


def _cell(text: str, width: int = 200) -> str:
    return " ".join(text.split())[:width].replace("|", "/")


def markdown(rows: list[AttemptRow]) -> str:
    """Per model: the counts, then each disagreement with its cause, then what did not load."""
    out = []
    for model, counts in summary(rows).items():
        out += [f"### {model}", "", "| outcome | attempts |", "|---|---:|"]
        out += [f"| {LABELS[k]} | {v} |" for k, v in counts.items()]
        mine = [r for r in rows if r.model == model]
        out += ["", "| outcome | file | theirs | ours | cause |", "|---|---|---|---|---|"]
        for r in disagreements(mine):
            theirs = r.theirs.verdict if r.theirs else "-"
            out.append(f"| {LABELS[r.outcome]} | `{r.group}/{r.file}` | {theirs} | {r.ours.status} | "
                       f"{_cell(r.cause, 300)} |")
        unloaded = [r for r in mine if r.outcome == "not_loaded"]
        if unloaded:
            out += ["", "Not loaded:", ""]
            out += [f"- `{r.group}/{r.file}` (`{r.task}`): {_cell(r.ours.message)}" for r in unloaded]
        out.append("")
    return "\n".join(out)
