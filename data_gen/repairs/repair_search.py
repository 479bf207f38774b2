"""Repair a real failing kernel without a model: the catalogue's repairers, as the verdict directs.

A real failure (a model's kernel, replayed) has no known repair. The search reads the verdict's
failure kind (`catalogue.classify`), applies that kind's repairer, grades the result, and goes on
from the next failure, until the kernel is graded correct or the budget of gradings is spent:

    verdict -> kind -> repairer(source, message) -> graded -> next verdict -> ...

An edit is kept only when the grader sees a change for the better: correct, or a failure at a
later stage, or another failure at the same stage (a fix that uncovers the next bug). An edit
that changes nothing the grader sees, or fails earlier, is undone, and the next repairer that
has a site in the kernel is tried. The explanation tells the kept edits in order, each with the
failure it answered: in a reviewer's prose where data_gen/repairs/descriptions.py knows the edit
(its claims checked against the edit and the verdict), else as the lines it changed. Both are
true by construction, since each edit is a graded step of the diff from the failing kernel to the
repair.

A truncated answer (the model stopped mid-code) has no repair without a model: its intent is
gone. It is recognised and not searched.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from data_gen.catalogue.kinds import KIND_NAMES, classify, kind
from data_gen.repairs.descriptions import DESCRIPTIONS
from data_gen.repairs.repairers import repair
from evaluator.candidate.policy import parse_module
from evaluator.record import Status, Verdict
from evaluator.stages import STAGE_ORDER

DEFAULT_BUDGET = 4  # gradings per failing kernel
# Repairers that fix a module's surface whatever the verdict named: tried after the kind's own.
SURFACE = ("undefined_name", "prose_in_code", "wrong_entry_point", "interpret_flag")
# Syntax errors that mean the text stops before the code does.
_CUT_OFF = re.compile(r"was never closed|unexpected EOF|expected an indented block|unterminated "
                      r"(triple-quoted )?string|incomplete input")


@dataclass(frozen=True)
class Edit:
    """One kept step of a search: the failure it answered and the source before and after."""

    kind: str       # the failure kind the verdict named
    repairer: str   # the repairer applied (data_gen/repairs/repairers.py)
    status: str     # the verdict status it answered
    before: str
    after: str
    message: str = ""  # the verdict's message it answered


@dataclass
class SearchResult:
    code: str                  # the last kernel kept
    verdict: Verdict           # its verdict
    edits: list[Edit] = field(default_factory=list)
    gradings: int = 0

    @property
    def repaired(self) -> bool:
        return self.verdict.ok and bool(self.edits)

    def label(self) -> str:
        """What wrote the repair, as a pair's `repaired_by` says it."""
        return "search: " + " + ".join(e.repairer for e in self.edits)

    def summary(self) -> dict[str, Any]:
        """What the journal keeps of a search."""
        return {"gradings": self.gradings, "repairers": [e.repairer for e in self.edits],
                "status": str(self.verdict.status)}


def truncated(code: str, verdict: Verdict) -> bool:
    """The answer stops before its code does: an open fence, or a module whose syntax error is
    an unclosed bracket, string or block at its very end."""
    if verdict.status == Status.EXTRACTION_ERROR and "truncated" in verdict.message:
        return True
    try:
        parse_module(code)
    except SyntaxError as exc:
        last = len(code.rstrip().splitlines())
        return bool(_CUT_OFF.search(str(exc.msg))) and (exc.lineno or 0) >= last - 1
    except ValueError:
        return False
    return False


def candidates(kind_name: str) -> list[str]:
    """Repairers to try for a failure of `kind_name` (UNCLASSIFIED too): its own, then the
    surface ones."""
    own = kind(kind_name).repairer if kind_name in KIND_NAMES else ""
    return ([own] if own else []) + [s for s in SURFACE if s != own]


def _progress(old: Verdict, new: Verdict) -> bool:
    """The grader sees a change for the better."""
    if new.ok:
        return True
    before, after = STAGE_ORDER.get(old.stage, 0), STAGE_ORDER.get(new.stage, 0)
    if after != before:
        return after > before
    return (new.status, new.message) != (old.status, old.message)


def search(code: str, verdict: Verdict, grade: Callable[[str], Verdict], budget: int = DEFAULT_BUDGET
           ) -> SearchResult:
    """Repair `code` (failing with `verdict`) by the catalogue's repairers within `budget`
    gradings; `grade(source)` grades a kernel on the train cases."""
    result = SearchResult(code, verdict)
    tried = {code}
    while not result.verdict.ok and result.gradings < budget:
        kind_name = classify(result.verdict.status, result.verdict.message)
        step = None
        for name in candidates(kind_name):
            fixed = repair(name, result.code, result.verdict.message)
            if fixed is None or fixed in tried:
                continue
            tried.add(fixed)
            graded = grade(fixed)
            result.gradings += 1
            if _progress(result.verdict, graded):
                step = Edit(kind_name, name, result.verdict.status, result.code, fixed, result.verdict.message), graded
                break
            if result.gradings >= budget:
                break
        if step is None:
            break
        edit, graded = step
        result.edits.append(edit)
        result.code, result.verdict = edit.after, graded
    return result


# --- the explanation: the kept edits, in order -----------------------------------------------------

def changed_lines(before: str, after: str) -> list[tuple[list[str], list[str]]]:
    """The diff's hunks as (removed lines, added lines), stripped of indentation."""
    a, b = before.splitlines(), after.splitlines()
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            hunks.append(([l.strip() for l in a[i1:i2] if l.strip()], [l.strip() for l in b[j1:j2] if l.strip()]))
    return hunks


def _hunk_sentence(removed: list[str], added: list[str]) -> str:
    quote = lambda lines: ", ".join(f"`{l}`" for l in lines)  # noqa: E731
    if removed and added:
        return f"write {quote(added)} in place of {quote(removed)}"
    if added:
        return f"add {quote(added)}"
    return f"delete {quote(removed)}"


def explain(edits: list[Edit]) -> str:
    """One numbered item per kept edit: the failure it answers (the kind's summary) and the
    lines it changes, in the order they were applied; a repairer whose edit a list of lines would
    not explain as well as prose (a stand-in kernel added, a grid rounded up) is told in a
    reviewer's words (descriptions.DESCRIPTIONS)."""
    items = []
    for n, edit in enumerate(edits, 1):
        told = DESCRIPTIONS[edit.repairer](edit.before, edit.after, edit.message) if edit.repairer in DESCRIPTIONS else ""
        if told:
            items.append(f"{n}. {told}")
            continue
        hunks = changed_lines(edit.before, edit.after)
        what = "; ".join(_hunk_sentence(r, a) for r, a in hunks)
        cause = kind(edit.kind).summary if edit.kind in KIND_NAMES else "an error no failure kind names"
        items.append(f"{n}. {cause[0].upper()}{cause[1:]}. Fix: {what}.")
    head = "One fix makes the kernel correct:" if len(items) == 1 else \
        f"{len(items)} fixes, each for the failure the previous one leaves, make the kernel correct:"
    return "\n".join([head, *items])
