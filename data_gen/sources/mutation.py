"""Where failing attempts come from: injected bugs, a model's own answers, or a replayed file.

Every source turns one work item into one journal entry: the attempt, the evaluator's verdicts,
and a Fixit pair when the evaluator confirmed both the failure and the repair (otherwise the
reason it was dropped). Items have stable ids, which is what lets a killed run resume.
"""
from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from chat import prompts
from chat.models import ChatModel
from data_gen.dataset import round_robin
from data_gen.fingerprint import fingerprint
from data_gen.explanations import explain
from data_gen.edits import BugOperator, Mutant
from data_gen.mutations import compound_with, mutants
from data_gen.catalogue import OPERATORS, kind_of_operator, operator
from data_gen.giveaways import row_giveaways
from data_gen.mix import target_mix
from data_gen.pairs import build_pair
from data_gen.text_rules import row_violations
from evaluator.extract import ExtractionError, extract_code
from evaluator.grader import Evaluator
from evaluator.record import Status, Verdict
from evaluator.stages import LAST_STATIC_STAGE, STAGE_NAMES
from tasks import get_task
from tasks.spec import Task

SPLIT = "train"  # attempts are graded on train cases only: held-out cases never reach the data
STAGE_ORDER = {name: i for i, name in enumerate(STAGE_NAMES)}
# What repairs a mutant: the correct kernel its bug went into (the pair's `repaired_by`).
SEED_KERNEL = "seed kernel"
# One compound bug (two bugs, one repair) per task when its budget has room for it.
COMPOUND_MIN_BUDGET = 6


@dataclass(frozen=True)
class PromptSettings:
    context: str
    generation: str


def seed_for(key: str) -> int:
    """A seed fixed by a key, so a rerun samples and grades exactly as the first run did."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % (2 ** 31)


class SeededGrading:
    """The evaluator on the train split, with the verdict of each distinct answer kept.

    One correct kernel repairs every mutant made from it. Its verdict is graded at most once per
    run, and usually never: the verdicts a run starts with (`known`) hold the fresh entries of
    the variant pool and the repairs journaled by the run it resumes. Every attempt at a task is
    graded on the same seeded inputs, so the host computes each reference output once.
    """

    def __init__(self, evaluator: Evaluator, run_seed: int, known: dict[str, Verdict] | None = None,
                 on_new_repair: Callable[[str, Verdict], None] | None = None):
        self.evaluator = evaluator
        self.run_seed = run_seed
        # one verdict per ("attempt", task, answer, through) or ("repair", repair_key)
        self._verdicts: dict[tuple, Verdict] = {("repair", key): v for key, v in (known or {}).items()}
        self._locks: dict[tuple, threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()
        self._on_new_repair = on_new_repair

    def grade(self, task: Task, answer: str, through: str | None = None) -> Verdict:
        """A verdict per distinct answer: a compound's second bug is also graded as an item."""
        return self._once(("attempt", task.name, answer, through), lambda: self.evaluator.grade(
            task, answer, SPLIT, seed=seed_for(f"{self.run_seed}:{task.name}"), through=through))

    def grade_repair(self, task: Task, code: str) -> Verdict:
        key = repair_key(task.name, code)

        def graded() -> Verdict:
            verdict = self.grade(task, prompts.code_block(code))
            if self._on_new_repair is not None:
                self._on_new_repair(key, verdict)
            return verdict

        return self._once(("repair", key), graded)

    def _once(self, key: tuple, compute: Callable[[], Verdict]) -> Verdict:
        """compute() once per key, even when many threads ask at once."""
        with self._guard:
            lock = self._locks[key]
        with lock:
            if key not in self._verdicts:
                self._verdicts[key] = compute()
            return self._verdicts[key]


def repair_key(task: str, code: str) -> str:
    """How a repair's verdict is keyed in the journal (and in the verdicts a run starts with)."""
    return f"{task}:{hashlib.sha256(code.encode()).hexdigest()[:16]}"


class DropReason(StrEnum):
    """Why an attempt gave no pair: the one list the run's summary counts by."""

    SURVIVED = "survived"                          # the evaluator found no fault in the mutant
    COMPOUND = "compound"                          # a compound's second bug is not seen behind the first
    UNEXPLAINED = "unexplained"                    # no true explanation for what was observed
    REPAIR_NOT_CONFIRMED = "repair not confirmed"  # the repaired kernel is not graded correct
    TEXT_RULES = "text rules"                      # the row breaks a rule on model-facing text
    GIVEAWAY = "giveaway"                          # failing and repair differ beyond the fix
    CORRECT_FIRST_TRY = "correct on the first try"
    NOT_REPAIRED = "not repaired"                  # no repair confirmed: the search or the model's turns ran out
    TRUNCATED = "truncated"                        # an answer cut off mid-code: its intent is gone
    ATTEMPT_CORRECT = "attempt is correct"         # a replayed attempt that passes
    GRADER_LIMIT = "grader_limit"                  # the evaluator could not run the attempt
    NO_EXPLANATION = "no explanation"              # a repair that came without one
    NOT_LOADED = "task not loaded"                 # a peer suite's task that does not load here


@dataclass(frozen=True)
class Dropped:
    reason: DropReason
    detail: str = ""

    def text(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


def attempt_entry(item_id: str, task: Task | str, source: str, origin: str, failing: Verdict | None,
                  pair: Any = None, dropped: Dropped | None = None, **extra: Any) -> dict[str, Any]:
    """The journal line for one attempt: `dropped` in words, `drop_reason` to count by. `task`
    is a name where none could be loaded."""
    return {"kind": "attempt", "id": item_id, "task": task if isinstance(task, str) else task.name,
            "source": source, "origin": origin,
            "status": failing.status if failing else None, "stage": failing.stage if failing else None,
            "seconds": round(failing.wall_s, 3) if failing else None,
            "pair": pair.to_dict() if pair else None, "dropped": dropped.text() if dropped else None,
            "drop_reason": dropped.reason if dropped else None, **extra}


# --- mutation ----------------------------------------------------------------------------------

@dataclass
class MutationSource:
    """Bugs injected into verified correct kernels; each mutant's repair is the kernel it came from.

    `variants` maps a task to its correct kernels, (name, source) pairs from the variant pool;
    a task without any uses its solution alone.
    """

    tasks: list[Task]
    max_per_task: int
    seed: int
    operators: tuple[BugOperator, ...] = OPERATORS
    variants: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    name: str = "mutation"

    def kernels(self, task: Task) -> list[tuple[str, str]]:
        return self.variants.get(task.name) or [("solution", task.solution_source())]

    def items(self) -> list[Mutant]:
        """Up to max_per_task mutants per task, their kinds drawn towards the target mix
        (data_gen/mix.py): each next mutant is of the kind furthest below its target share
        among the kinds the task's kernels offer. Within a kind, operators take turns, and within
        an operator the kernels take turns (each a repair) in a seeded order. With every operator
        in use, one mutant per task is a compound of two bugs."""
        target = target_mix()
        chosen: list[Mutant] = []
        counts: Counter[str] = Counter()  # kinds taken so far, over all tasks
        for task in self.tasks:
            rng = random.Random(f"{self.seed}:{task.name}")
            by_op: dict[str, dict[str, list[Mutant]]] = defaultdict(lambda: defaultdict(list))
            for variant, source in self.kernels(task):
                for mutant in mutants(task, self.operators, source, variant, _variant_key(variant, source)):
                    by_op[mutant.operator][variant].append(mutant)
            by_kind: dict[str, list[list[Mutant]]] = defaultdict(list)
            for op in sorted(by_op, key=lambda name: rng.random()):
                per_kernel = [rng.sample(ms, len(ms)) for ms in by_op[op].values()]
                by_kind[kind_of_operator(op)].append(round_robin(per_kernel, 0))
            queues = {kind: round_robin(ops, 0) for kind, ops in by_kind.items()}
            every = len(self.operators) == len(OPERATORS)
            compound = every and self.max_per_task >= COMPOUND_MIN_BUDGET
            budget = self.max_per_task - compound if self.max_per_task > 0 else sum(map(len, queues.values()))
            taken = _towards(queues, target, budget, counts, rng)
            if compound:  # its runtime bug is one of the task's own mutants, graded anyway
                semantic = [m for m in taken if operator(m.operator).family == "semantic"]
                second = rng.choice(semantic) if semantic else None
                pair = second and compound_with(task, dict(self.kernels(task))[second.variant], second, rng)
                taken += [pair] if pair else []
            chosen.extend(taken)
        return chosen

    def process(self, mutant: Mutant, grader: SeededGrading, prompt: PromptSettings) -> dict[str, Any]:
        task = get_task(mutant.task)
        extra = {"line": mutant.line, "variant": mutant.variant}

        def drop(verdict: Verdict, reason: DropReason, detail: str) -> dict[str, Any]:
            return attempt_entry(mutant.id, task, self.name, mutant.operator, verdict,
                                 dropped=Dropped(reason, detail), **extra)

        graded, failing = first_failure(task, mutant, grader)
        if failing.ok or failing.status == "pending":
            static = failing.status == "pending"  # graded through the static stages only
            return drop(failing, DropReason.SURVIVED,
                        f"{'the static stages' if static else 'the evaluator'} found no fault")
        part_verdicts: tuple[Verdict, ...] = ()
        if graded.parts:  # the second bug must fail by itself, and later than what was observed
            alone = grader.grade(task, graded.parts[1].answer())
            if alone.ok or STAGE_ORDER.get(alone.stage, 0) <= STAGE_ORDER.get(failing.stage, 0):
                return drop(failing, DropReason.COMPOUND, "the second bug is not seen behind the first")
            part_verdicts = (failing, alone)
        explanation = explain(graded, failing, part_verdicts)
        if explanation is None:
            return drop(failing, DropReason.UNEXPLAINED, f"{mutant.operator} observed as {failing.status}")
        repair = dict(self.kernels(task))[mutant.variant]
        repaired = grader.grade_repair(task, repair)
        if not repaired.ok:
            return drop(failing, DropReason.REPAIR_NOT_CONFIRMED, repaired.status)
        pair = build_pair(task, attempt_id=mutant.id, source=self.name, origin=mutant.operator,
                          context=prompt.context, generation=prompt.generation,
                          failing_answer=graded.answer(), failing_code=graded.code, failing=failing,
                          explanation=explanation, repair_code=repair, repaired=repaired,
                          repaired_by=SEED_KERNEL)
        broken = row_violations(pair.to_dict())
        if broken:
            return drop(failing, DropReason.TEXT_RULES, ", ".join(broken))
        leftover = row_giveaways(graded.code, repair)
        if leftover:
            return drop(failing, DropReason.GIVEAWAY, ", ".join(leftover))
        return attempt_entry(mutant.id, task, self.name, mutant.operator, failing, pair, **extra)


def first_failure(task: Task, mutant: Mutant, grader: SeededGrading) -> tuple[Mutant, Verdict]:
    """Grade the mutant, then its larger fallbacks while it survives: the smallest that fails.
    A static bug (a compound's first bug included) is graded through the static stages only."""
    static = bool(mutant.parts) or operator(mutant.operator).static
    for candidate in (mutant, *mutant.fallbacks):
        verdict = grader.grade(task, candidate.answer(), through=LAST_STATIC_STAGE if static else None)
        if not verdict.ok and verdict.status != "pending":
            break
    return candidate, verdict


def _towards(queues: dict[str, list[Mutant]], target: dict[str, float], budget: int, counts: Counter[str],
             rng: random.Random) -> list[Mutant]:
    """Take `budget` mutants from the kinds' queues, each time from the kind whose count (over
    the whole run, `counts`, updated here) is furthest below its target share, and within it the
    next mutant of the kernel used least so far (each kernel is a repair)."""
    taken: list[Mutant] = []
    order = {kind: rng.random() for kind in queues}
    uses: Counter[str] = Counter()
    while len(taken) < budget and any(queues.values()):
        total = sum(counts.values()) + 1
        kind = max((k for k, q in queues.items() if q), key=lambda k: (target.get(k, 0.0) * total - counts[k], order[k]))
        queue = queues[kind]
        mutant = queue.pop(min(range(len(queue)), key=lambda i: (uses[queue[i].variant], i)))
        taken.append(mutant)
        counts[kind] += 1
        uses[mutant.variant] += 1
    return taken


def _variant_key(variant: str, source: str) -> str:
    """The solution keeps its historical mutant ids; other kernels' ids carry their fingerprint."""
    return "" if variant == "solution" else fingerprint(source)


# --- model -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelItem:
    id: str
    task: str
    sample: int


def code_of(answer: str, task: Task | None = None) -> str | None:
    """The answer's code as the evaluator extracts it for `task`, or None."""
    try:
        return extract_code(answer, task.entry_points if task else "kernel")
    except ExtractionError:
        return None


@dataclass
class ModelSource:
    """A model writes kernels for train prompts; each failure goes through a repair loop.

    The evaluator's feedback goes back to the teacher (or the model itself) for up to max_turns
    turns. The first repair the evaluator confirms makes a pair with the attempt it repaired,
    and the teacher's prose is the explanation.
    """

    tasks: list[Task]
    model: ChatModel
    teacher: ChatModel | None
    samples: int
    max_turns: int
    temperature: float
    max_tokens: int
    name: str = "model"

    def items(self) -> list[ModelItem]:
        return [ModelItem(f"{t.name}:{self.model.name}:{k}", t.name, k)
                for t in self.tasks for k in range(self.samples)]

    def process(self, item: ModelItem, grader: SeededGrading, prompt: PromptSettings) -> dict[str, Any]:
        task = get_task(item.task)
        head = prompts.task_messages(task, prompt.context, prompt.generation)
        answer = self.model.complete(head, temperature=self.temperature, max_tokens=self.max_tokens,
                                     seed=seed_for(item.id))
        first = grader.grade(task, answer)
        turns = [_turn(self.model.name, answer, first)]
        if first.ok:
            return attempt_entry(item.id, task, self.name, self.model.name, first,
                                 dropped=Dropped(DropReason.CORRECT_FIRST_TRY), turns=turns)
        fixer = self.teacher or self.model
        pair, dropped = repair_loop(task, head, answer, first, fixer, grader, self.max_turns, turns, item.id,
                                    self.name, self.model.name, prompt, self.temperature, self.max_tokens)
        return attempt_entry(item.id, task, self.name, self.model.name, first, pair, dropped, turns=turns)


def repair_loop(task: Task, head: list[dict[str, str]], answer: str, verdict: Verdict, fixer: ChatModel,
                grader: SeededGrading, max_turns: int, turns: list[dict[str, Any]], item_id: str, source: str,
                origin: str, prompt: PromptSettings, temperature: float | None, max_tokens: int):
    """Up to `max_turns` turns of the evaluator's feedback to `fixer`; the first repair the
    evaluator confirms makes the pair, with the attempt it repaired (a failed repair is the next
    failing attempt). Each turn is appended to `turns`. Returns (pair, dropped)."""
    for turn in range(1, max_turns + 1):
        reply = fixer.complete(prompts.repair_messages(head, answer, verdict), temperature=temperature,
                               max_tokens=max_tokens, seed=seed_for(f"{item_id}:{turn}"))
        repaired = grader.grade(task, reply)
        turns.append(_turn(fixer.name, reply, repaired))
        if repaired.ok:
            return pair_from_reply(task, item_id, source, origin, prompt, answer, verdict, reply, repaired,
                                   f"model: {fixer.name}")
        answer, verdict = reply, repaired
    return None, Dropped(DropReason.NOT_REPAIRED, f"{max_turns} turns of {fixer.name} tried")


def _turn(model: str, answer: str, verdict: Verdict) -> dict[str, Any]:
    return {"model": model, "answer": answer, "status": verdict.status, "message": verdict.message}


def pair_from_reply(task: Task, attempt_id: str, source: str, origin: str, prompt: PromptSettings,
                    failing_answer: str, failing: Verdict, reply: str, repaired: Verdict, repaired_by: str):
    """A pair from a confirmed repair; the reply's prose (outside code) is the explanation."""
    if failing.status == Status.GRADER_LIMIT:  # the grader could not run the attempt: no fault is confirmed
        return None, Dropped(DropReason.GRADER_LIMIT, "the evaluator could not run the attempt, so no failure "
                                                      "was confirmed")
    explanation = prompts.strip_code(reply)
    if not explanation:
        return None, Dropped(DropReason.NO_EXPLANATION, "the repair came without one")
    pair = build_pair(task, attempt_id=attempt_id, source=source, origin=origin, context=prompt.context,
                      generation=prompt.generation, failing_answer=failing_answer,
                      failing_code=code_of(failing_answer, task) or failing_answer, failing=failing,
                      explanation=explanation, repair_code=extract_code(reply, task.entry_points),
                      repaired=repaired, repaired_by=repaired_by)
    return pair, None
