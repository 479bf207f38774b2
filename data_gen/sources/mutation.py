"""Injected bugs as the source: each mutant of a verified correct kernel, and its repair the kernel
it came from.

An item walks forward: the mutant (data_gen/failures/), its verdict (the smallest fallback that
fails, `first_failure`), the explanation of what was observed (data_gen/rows/explanations.py),
the repair's verdict, the pair and the row rules, the journal line. Which mutants a run takes
follows the target mix of failure kinds (data_gen/catalogue/mix.py).
"""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from data_gen.catalogue.kinds import kind_of_operator
from data_gen.catalogue.mix import target_mix
from data_gen.failures.edits import BugOperator, Mutant
from data_gen.failures.fingerprint import fingerprint
from data_gen.failures.giveaways import row_giveaways
from data_gen.failures.mutations import PendingMutant, compound_with, pending_mutants
from data_gen.failures.operators import OPERATORS, operator
from data_gen.rows.dataset import round_robin
from data_gen.rows.explanations import explain
from data_gen.rows.journal import Dropped, DropReason, attempt_entry, undecided
from data_gen.rows.pairs import PromptSettings, build_pair
from data_gen.rows.text_rules import row_violations
from data_gen.sources.grading import SeededGrading
from evaluator.record import Verdict
from evaluator.stages import LAST_STATIC_STAGE, STAGE_ORDER
from tasks import get_task
from tasks.spec import Task

# What repairs a mutant: the correct kernel its bug went into (the pair's `repaired_by`).
SEED_KERNEL = "seed kernel"
# One compound bug (two bugs, one repair) per task when its budget has room for it.
COMPOUND_MIN_BUDGET = 6


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
        (data_gen/catalogue/mix.py): each next mutant is of the kind furthest below its target share
        among the kinds the task's kernels offer. Within a kind, operators take turns, and within
        an operator the kernels take turns (each a repair) in a seeded order. With every operator
        in use, one mutant per task is a compound of two bugs."""
        target = target_mix()
        chosen: list[Mutant] = []
        counts: Counter[str] = Counter()  # kinds taken so far, over all tasks
        for task in self.tasks:
            rng = random.Random(f"{self.seed}:{task.name}")
            by_op: dict[str, dict[str, list[PendingMutant]]] = defaultdict(lambda: defaultdict(list))
            for variant, source in self.kernels(task):
                for pending in pending_mutants(task, self.operators, source, variant, _variant_key(variant, source)):
                    by_op[pending.operator][variant].append(pending)
            by_kind: dict[str, list[list[PendingMutant]]] = defaultdict(list)
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
        if failing.undecided:
            why = undecided(failing)
            return drop(failing, why.reason, why.detail)
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
        if not verdict.ok and verdict.status != "pending" and not verdict.undecided:
            break
    return candidate, verdict


def _towards(queues: dict[str, list[PendingMutant]], target: dict[str, float], budget: int, counts: Counter[str],
             rng: random.Random) -> list[Mutant]:
    """Take `budget` mutants from the kinds' queues, each time from the kind whose count (over
    the whole run, `counts`, updated here) is furthest below its target share, and within it the
    next mutant of the kernel used least so far (each kernel is a repair). A mutant is made when
    it is taken; one that cannot be made, or repeats a source taken before, is passed over."""
    taken: list[Mutant] = []
    order = {kind: rng.random() for kind in queues}
    uses: Counter[str] = Counter()
    seen = {p.module.source for queue in queues.values() for p in queue}  # the kernels unchanged
    while len(taken) < budget and any(queues.values()):
        total = sum(counts.values()) + 1
        kind = max((k for k, q in queues.items() if q), key=lambda k: (target.get(k, 0.0) * total - counts[k], order[k]))
        queue = queues[kind]
        mutant = queue.pop(min(range(len(queue)), key=lambda i: (uses[queue[i].variant], i))).make()
        if mutant is None or mutant.source in seen:
            continue
        seen.add(mutant.source)
        taken.append(mutant)
        counts[kind] += 1
        uses[mutant.variant] += 1
    return taken


def _variant_key(variant: str, source: str) -> str:
    """The solution keeps its historical mutant ids; other kernels' ids carry their fingerprint."""
    return "" if variant == "solution" else fingerprint(source)
