"""A model's own answers as the source: it writes kernels for train prompts, and each failure
goes through a repair loop of the evaluator's feedback (to a teacher, or to the model itself).

An item walks forward: the model's answer, its verdict, the repair turns, the pair built from the
first confirmed repair (data_gen/rows/pairs.py `pair_from_reply`), the journal line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat import prompts
from chat.models import ChatModel
from data_gen.rows.journal import Dropped, DropReason, attempt_entry
from data_gen.rows.pairs import PromptSettings, pair_from_reply
from data_gen.sources.grading import SeededGrading, seed_for
from evaluator.record import Verdict
from tasks import get_task
from tasks.spec import Task


@dataclass(frozen=True)
class ModelItem:
    id: str
    task: str
    sample: int


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
