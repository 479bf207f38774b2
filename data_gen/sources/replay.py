"""Real failing attempts, replayed and repaired: a JSONL file of attempts, a `training.rebench`
journal, or the generated kernels of a JAXBench checkout.

Each attempt is graded for its task on the train cases. A failure is repaired, in this order:
1. by the repair the row brings, if any (`repair`, with its `explanation`);
2. by the repair search (data_gen/repairs/repair_search.py): the failure catalogue's repairers, applied
   as each verdict directs and graded after each edit, within a budget of gradings;
3. by a teacher model, when one is given: up to `--max-turns` turns with our feedback.
A pair is kept only when its repair is graded correct on every train case. An answer cut off
mid-code is not searched: without a model its intent is gone (`truncated`).
"""
from __future__ import annotations

import difflib
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chat import prompts
from chat.models import ChatModel
from data_gen.catalogue.kinds import classify
from data_gen.repairs import repair_search
from data_gen.rows.journal import Dropped, DropReason, attempt_entry, undecided
from data_gen.rows.pairs import PromptSettings, build_pair, code_of, pair_from_reply
from data_gen.rows.text_rules import prose, row_violations
from data_gen.sources.grading import SeededGrading
from data_gen.sources.model import repair_loop
from evaluator.record import Status
from tasks import get_task
from tasks.spec import Task

GIVEN = "given"          # repaired_by: the row brought its own repair


@dataclass(frozen=True)
class ReplayItem:
    id: str
    task: str
    attempt: str
    repair: str | None = None
    explanation: str | None = None
    model: str = "replay"


def _item(task: str, attempt: str, repair: str | None = None, explanation: str | None = None,
          model: str = "replay", key: str = "") -> ReplayItem:
    """An item whose id is fixed by its content, so a rerun resumes it."""
    digest = hashlib.sha256(f"{task}\0{attempt}\0{repair}".encode()).hexdigest()[:16]
    return ReplayItem(f"{key or task}:replay:{digest}", task, attempt, repair, explanation, model)


def read_replay(path: Path) -> list[ReplayItem]:
    """The attempts of a replay file. Two kinds of line are read:
    - an attempt: {"task", "attempt", optional "repair", "explanation", "model"};
    - a `training.rebench` journal line: {"kind": "answer", "answer", "conversation", "verdict"}
      (the model is the conversation's first field; answers its verdict calls correct, and the
      journal's other lines, are skipped)."""
    if not path.is_file():
        raise FileNotFoundError(f"replay file not found: {path}")
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if "kind" in row:  # a rebench journal
                if row["kind"] != "answer" or row["verdict"]["status"] == Status.CORRECT:
                    continue
                get_task(row["verdict"]["task"])
                items.append(_item(row["verdict"]["task"], row["answer"], model=row["conversation"].split("|")[0]))
                continue
            get_task(row["task"])
            items.append(_item(row["task"], row["attempt"], row.get("repair"), row.get("explanation"),
                               row.get("model", "replay")))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: not a replay row ({type(exc).__name__}: {exc}); expected JSON "
                             "with task and attempt, or a rebench journal line") from None
    return list({item.id: item for item in items}.values())  # a model that repeats itself: graded once


def checkout_items(root: Path, models: list[str] | None, loadable: set[str]) -> list[ReplayItem]:
    """The generated kernels of a JAXBench checkout (pallas_eval/generated/<model>/...), for the
    tasks the checkout has, as they were written (no fence added)."""
    from suites.attempts import discover

    return [_item(a.task, a.text(), model=a.model, key=a.key) for a in discover(root, models) if a.task in loadable]


@dataclass
class ReplaySource:
    """Replayed attempts, graded and repaired (see the module docstring)."""

    attempts: list[ReplayItem]
    task_of: Callable[[str], Task]
    teacher: ChatModel | None = None
    max_turns: int = 2
    max_tokens: int = 4096
    budget: int = repair_search.DEFAULT_BUDGET
    name: str = "replay"

    def items(self) -> list[ReplayItem]:
        return self.attempts

    def process(self, item: ReplayItem, grader: SeededGrading, prompt: PromptSettings) -> dict[str, Any]:
        from suites import LoadError

        try:
            task = self.task_of(item.task)
        except LoadError as exc:
            return attempt_entry(item.id, item.task, self.name, item.model, None,
                                 dropped=Dropped(DropReason.NOT_LOADED, str(exc)[:300]))
        failing = grader.grade(task, item.attempt)
        kind = None if failing.ok else classify(failing.status, failing.message)

        def entry(pair: Any = None, dropped: Dropped | None = None, **extra: Any) -> dict[str, Any]:
            return attempt_entry(item.id, task, self.name, item.model, failing, pair, dropped,
                                 failure_kind=kind, **extra)

        if failing.ok:
            return entry(dropped=Dropped(DropReason.ATTEMPT_CORRECT))
        if failing.undecided:  # the grader could not run or check it all: no fault is confirmed
            return entry(dropped=undecided(failing))
        if item.repair is not None:
            reply = item.repair
            if item.explanation:
                reply = f"{item.explanation}\n\n{prompts.code_block(code_of(reply, task) or reply)}"
            repaired = grader.grade(task, reply)
            if not repaired.ok:
                return entry(dropped=Dropped(DropReason.REPAIR_NOT_CONFIRMED, repaired.status))
            return entry(*pair_from_reply(task, item.id, self.name, item.model, prompt, item.attempt, failing,
                                          reply, repaired, GIVEN), repaired=True)
        code = code_of(item.attempt, task) or item.attempt
        cut_off = repair_search.truncated(code, failing)
        searched: dict[str, Any] = {}
        if not cut_off and self.budget > 0:
            found = repair_search.search(code, failing, lambda src: grader.grade(task, prompts.code_block(src)),
                                         self.budget)
            searched = {"search": found.summary()}
            if found.repaired:
                pair = build_pair(task, attempt_id=item.id, source=self.name, origin=item.model,
                                  context=prompt.context, generation=prompt.generation, failing_answer=item.attempt,
                                  failing_code=code, failing=failing, explanation=repair_search.explain(found.edits),
                                  repair_code=found.code, repaired=found.verdict, repaired_by=found.label())
                broken = row_violations(pair.to_dict())
                if broken:
                    return entry(dropped=Dropped(DropReason.TEXT_RULES, ", ".join(broken)), repaired=True, **searched)
                return entry(pair, repaired=True, **searched)
        if self.teacher is not None:
            turns: list[dict[str, Any]] = []
            head = prompts.task_messages(task, prompt.context, prompt.generation)
            pair, dropped = repair_loop(task, head, item.attempt, failing, self.teacher, grader, self.max_turns,
                                        turns, item.id, self.name, item.model, prompt, 0.0, self.max_tokens)
            return entry(pair, dropped, turns=turns, truncated=cut_off,
                         repaired=any(t["status"] == Status.CORRECT for t in turns), **searched)
        if cut_off:
            return entry(dropped=Dropped(DropReason.TRUNCATED, "cut off mid-code: not repairable without a model "
                                                               "(give --teacher)"), truncated=True)
        how = "search: " + ", ".join(f"{k} {v}" for k, v in searched["search"].items()) if searched else "no search"
        return entry(dropped=Dropped(DropReason.NOT_REPAIRED, how), **searched)


# --- the card's yield table ------------------------------------------------------------------------

CHARS_PER_TOKEN = (3, 4)  # code runs about 3-4 characters a token in the common tokenizers
NEAR_LIMIT = 0.8          # an answer this close to its token limit was cut off by it
EXAMPLE_DIFF_LINES = 30   # a card example's diff, at most


@dataclass
class KindYield:
    failures: int = 0
    truncated: int = 0
    repaired: int = 0
    pairs: int = 0


@dataclass
class Yield:
    """Failures -> repaired -> kept pairs, by failure kind (the card's table)."""

    by_kind: dict[str, KindYield] = field(default_factory=dict)
    by_repairer: Counter = field(default_factory=Counter)
    attempts: int = 0
    correct: int = 0
    not_graded: int = 0   # grader limits and tasks that do not load
    cut_off_chars: list[int] = field(default_factory=list)  # each truncated answer's length
    answer_limit: int | None = None  # the output tokens the answers' request allowed, where known
    examples: list[dict[str, Any]] = field(default_factory=list)  # kept pairs the card shows

    @classmethod
    def of(cls, entries: list[dict[str, Any]], kept: list[dict[str, Any]], items: Sequence[ReplayItem] = (),
           answer_limit: int | None = None) -> "Yield":
        """The yield of a run's journal `entries`; `items` (the attempts) give the truncated
        answers' lengths."""
        out = cls(attempts=len(entries), answer_limit=answer_limit, examples=examples(kept))
        length = {i.id: len(i.attempt) for i in items}
        kept_ids = Counter(r["attempt_id"] for r in kept)
        for e in entries:
            if e["drop_reason"] == DropReason.ATTEMPT_CORRECT:
                out.correct += 1
                continue
            if e["drop_reason"] in (DropReason.GRADER_LIMIT, DropReason.UNVERIFIED, DropReason.NOT_LOADED) \
                    or not e.get("failure_kind"):
                out.not_graded += 1
                continue
            k = out.by_kind.setdefault(e["failure_kind"], KindYield())
            k.failures += 1
            k.truncated += bool(e.get("truncated"))
            k.repaired += bool(e.get("repaired"))
            k.pairs += kept_ids[e["id"]]
            if e.get("truncated") and e["id"] in length:
                out.cut_off_chars.append(length[e["id"]])
        out.by_repairer = Counter(r["repaired_by"] for r in kept)
        return out

    def table(self) -> str:
        lines = ["| failure kind | failures | truncated | repaired | pairs kept |", "|---|---:|---:|---:|---:|"]
        rows = sorted(self.by_kind.items(), key=lambda kv: (-kv[1].failures, kv[0]))
        lines += [f"| {k} | {y.failures} | {y.truncated} | {y.repaired} | {y.pairs} |" for k, y in rows]
        total = KindYield(*(sum(getattr(y, f) for y in self.by_kind.values())
                            for f in ("failures", "truncated", "repaired", "pairs")))
        lines.append(f"| **all** | {total.failures} | {total.truncated} | {total.repaired} | {total.pairs} |")
        return "\n".join(lines)

    def card_section(self) -> str:
        by = "\n".join(f"| {k} | {n} |" for k, n in self.by_repairer.most_common())
        return (f"## Yield\n\n{self.attempts} attempts: {self.correct} graded correct, {self.not_graded} not "
                f"graded (a task that does not load here, or a kernel the grader cannot run), the rest failed. "
                f"Each failure by its kind in the failure catalogue, then how many were cut off mid-code, how "
                f"many a repair was graded correct for, and how many pairs the dataset keeps:\n\n{self.table()}\n\n"
                f"{self.cut_off_text()}What wrote the repairs of the kept pairs (`repaired_by`):\n\n"
                f"| repaired by | pairs |\n|---|---:|\n{by}\n{example_section(self.examples)}")

    def cut_off_text(self) -> str:
        """How long the truncated answers were against the output limit of their request: an
        answer that stops far short of it lost its budget elsewhere (a thinking model's reasoning
        counts against the same limit), one at it needs a larger limit."""
        if not self.cut_off_chars:
            return ""
        chars = sorted(self.cut_off_chars)
        n, median = len(chars), chars[len(chars) // 2]
        fewest, most = CHARS_PER_TOKEN
        text = (f"Answers cut off mid-code: {n}, stopping after a median of {median:,} characters of code (the longest "
                f"{chars[-1]:,}), about {median // most:,}-{median // fewest:,} tokens at {fewest}-{most} characters a "
                "token.")
        if self.answer_limit:
            near = sum(c / fewest >= NEAR_LIMIT * self.answer_limit for c in chars)
            text += (f" Their request allowed {self.answer_limit:,} output tokens: {near} of the {n} reach "
                     f"{NEAR_LIMIT:.0%} of that even at {fewest} characters a token (cut off by the limit: a larger "
                     f"one keeps them whole); {n - near} stop short of it, so the rest of their budget went to output "
                     "the answer does not show, such as a thinking model's reasoning, which counts against the same "
                     "limit: raise the limit or lower the thinking budget.")
        return text + "\n\n"


def examples(kept: list[dict[str, Any]], n: int = 2) -> list[dict[str, Any]]:
    """Kept pairs for the card to show: the smallest repair (fewest changed lines) of the most
    common `repaired_by`, then of the most common that shares no repairer with those before it
    (different fixes to read), for `n` of them where there are that many."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for row in kept:
        by_label.setdefault(row["repaired_by"], []).append(row)
    chosen: list[str] = []
    for label in sorted(by_label, key=lambda r: (-len(by_label[r]), r)):
        if len(chosen) < n and not any(_repairers(label) & _repairers(c) for c in chosen):
            chosen.append(label)
    return [min(by_label[label], key=lambda row: (len(_diff(row)), row["id"])) for label in chosen]


def _repairers(label: str) -> set[str]:
    """The repairers a `repaired_by` names: "search: a + b" -> {a, b}; any other label is its own."""
    return set(label.removeprefix("search: ").split(" + ")) if label.startswith("search: ") else {label}


def _diff(row: dict[str, Any]) -> list[str]:
    return list(difflib.unified_diff(row["failing_code"].splitlines(), row["repair_code"].splitlines(),
                                     "failing", "repaired", n=1, lineterm=""))


def example_section(rows: list[dict[str, Any]]) -> str:
    """The card's example pairs: each explanation as the dataset holds it, then its diff."""
    if not rows:
        return ""
    parts = ["\n## Two explanations\n" if len(rows) == 2 else "\n## Explanations\n",
             "As the pairs hold them (`repaired_by` in the heading), each followed by its diff from the failing "
             "kernel to the repair:\n"]
    for row in rows:
        explanation = prose(row["messages"][-1]["content"]).strip()
        diff = _diff(row)
        shown = diff[:EXAMPLE_DIFF_LINES] + ([f"... ({len(diff) - EXAMPLE_DIFF_LINES} more diff lines)"]
                                             if len(diff) > EXAMPLE_DIFF_LINES else [])
        parts.append(f"### {row['task']} ({row['repaired_by']})\n\n> " + explanation.replace("\n", "\n> ")
                     + "\n\n```diff\n" + "\n".join(shown) + "\n```\n")
    return "\n".join(parts)
