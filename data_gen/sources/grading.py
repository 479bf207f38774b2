"""The grading every source shares: the evaluator on the train split, seeded by the run.

Attempts are graded on train cases only (held-out cases never reach the data), every attempt at a
task on the same seeded inputs, and the verdict of each distinct answer is kept, so a rerun grades
exactly as the first run did and a repair kernel behind many mutants is graded once.
"""
from __future__ import annotations

import hashlib
import threading
from collections import defaultdict
from collections.abc import Callable

from chat import prompts
from evaluator.grader import Evaluator
from evaluator.record import Verdict
from tasks.spec import Task

SPLIT = "train"  # attempts are graded on train cases only: held-out cases never reach the data


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
