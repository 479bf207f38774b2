"""The Fixit pair: five messages and the columns around them (the design's dataset row).

system (role + optional hardware context), user (task prompt), assistant (the failing attempt),
user (the evaluator's feedback for it), assistant (explanation, then the repaired kernel). Only
the last message is trained on. A repair that came as a model's reply makes its pair here too
(`pair_from_reply`): the reply's prose is the explanation.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from chat import prompts
from data_gen.catalogue.kinds import classify
from data_gen.failures.fingerprint import normalized
from data_gen.rows.journal import Dropped, DropReason, undecided
from evaluator.candidate.extract import ExtractionError, extract_code
from evaluator.record import Verdict
from tasks.spec import Task

# Verdict fields kept in the dataset: enough to audit a row, without per-seed noise.
_VERDICT_FIELDS = ("task", "task_version", "status", "stage", "message", "backend", "split",
                   "error_type", "candidate_sha256", "versions")


@dataclass
class FixitPair:
    id: str
    attempt_id: str
    task: str
    task_version: int
    level: int
    case_split: str          # always "train": held-out cases never reach a dataset
    error_class: str         # the failing kernel's verdict status
    failure_kind: str        # its kind in the failure catalogue (data_gen/catalogue/kinds.py)
    failing_stage: str
    source: str              # mutation | model | replay | jaxbench
    origin: str              # bug operator, or the model whose attempt failed
    repaired_by: str         # what wrote the repair: seed kernel | search: <repairers> | model: <name> | given
    context: str             # none | spec | guide: what the system prompt carried
    messages: list[dict[str, str]]
    failing_verdict: str     # JSON of the evaluator's verdict on the failing kernel
    repair_verdict: str      # JSON of its verdict on the repaired kernel
    failing_code: str
    repair_code: str
    # The repaired kernel's predicted speedup over XLA (static, for the verdict's generation:
    # evaluator/performance/prediction.py); None where it had none.
    repair_predicted_speedup: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def verdict_json(verdict: Verdict) -> str:
    summary = {k: getattr(verdict, k) for k in _VERDICT_FIELDS}
    summary["cases"] = [{"name": c.name, "status": c.status, "rel_l2_err": c.rel_l2_err} for c in verdict.cases]
    p = verdict.predicted_speedup
    summary["predicted_speedup"] = None if p is None else {
        "overall": p["overall"], "generation": p["generation"], "label": p["label"], "method": p["method"],
        "cases": {name: c["speedup"] for name, c in p["cases"].items()}}
    return json.dumps(summary, sort_keys=True)


def build_pair(task: Task, *, attempt_id: str, source: str, origin: str, context: str, generation: str,
               failing_answer: str, failing_code: str, failing: Verdict, explanation: str,
               repair_code: str, repaired: Verdict, repaired_by: str) -> FixitPair:
    """Assemble the row. The caller has confirmed `failing` failed and `repaired` is correct."""
    if failing.ok or not repaired.ok:
        raise ValueError("a pair needs a failing kernel and a correct repair")
    messages = prompts.repair_messages(prompts.task_messages(task, context, generation), failing_answer, failing)
    messages.append({"role": "assistant", "content": f"{explanation.strip()}\n\n{prompts.code_block(repair_code)}"})
    pair_id = hashlib.sha256(f"{task.name}\0{normalized(failing_code)}\0{normalized(repair_code)}\0{context}"
                             .encode()).hexdigest()[:16]
    return FixitPair(
        id=pair_id, attempt_id=attempt_id, task=task.name, task_version=task.version, level=task.level,
        case_split=failing.split, error_class=failing.status,
        failure_kind=classify(failing.status, failing.message), failing_stage=failing.stage, source=source,
        origin=origin, repaired_by=repaired_by, context=context, messages=messages,
        failing_verdict=verdict_json(failing), repair_verdict=verdict_json(repaired), failing_code=failing_code,
        repair_code=repair_code,
        repair_predicted_speedup=None if repaired.predicted_speedup is None else repaired.predicted_speedup["overall"])


@dataclass(frozen=True)
class PromptSettings:
    """What a run's prompts say besides the task: the hardware context and the TPU generation."""

    context: str
    generation: str


def code_of(answer: str, task: Task | None = None) -> str | None:
    """The answer's code as the evaluator extracts it for `task`, or None."""
    try:
        return extract_code(answer, task.entry_points if task else "kernel")
    except ExtractionError:
        return None


def pair_from_reply(task: Task, attempt_id: str, source: str, origin: str, prompt: PromptSettings,
                    failing_answer: str, failing: Verdict, reply: str, repaired: Verdict, repaired_by: str):
    """A pair from a confirmed repair; the reply's prose (outside code) is the explanation."""
    if failing.undecided:
        return None, undecided(failing)
    explanation = prompts.strip_code(reply)
    if not explanation:
        return None, Dropped(DropReason.NO_EXPLANATION, "the repair came without one")
    pair = build_pair(task, attempt_id=attempt_id, source=source, origin=origin, context=prompt.context,
                      generation=prompt.generation, failing_answer=failing_answer,
                      failing_code=code_of(failing_answer, task) or failing_answer, failing=failing,
                      explanation=explanation, repair_code=extract_code(reply, task.entry_points),
                      repaired=repaired, repaired_by=repaired_by)
    return pair, None
