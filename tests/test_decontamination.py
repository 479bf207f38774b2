"""Held-out cases and held-out tasks never reach a prompt or a dataset row."""
import pytest

from chat.context import CONTEXTS
from chat.prompts import system_prompt, task_prompt
from data_gen.rows.dataset import ContaminationError, check_clean, heldout_markers
from tasks import all_tasks, get_task

TRAIN = [t for t in all_tasks() if not t.heldout_task]
HELDOUT_TASKS = [t for t in all_tasks() if t.heldout_task]


def test_every_task_has_heldout_shapes_a_prompt_could_leak():
    for task in all_tasks():
        assert heldout_markers(task), task.name  # otherwise the checks below could not fail


@pytest.mark.parametrize("task", TRAIN, ids=lambda t: t.name)
def test_task_prompt_shows_train_shapes_only(task):
    prompt = task_prompt(task)
    assert not [m for m in heldout_markers(task) if m in prompt]
    assert not [t.name for t in HELDOUT_TASKS if f"`{t.name}`" in prompt]
    assert task.select("train", "check")  # and the train shapes are there
    from chat.prompts import describe_case
    assert all(describe_case(task, c) in prompt for c in task.select("train"))


@pytest.mark.parametrize("context", CONTEXTS)
def test_system_prompts_carry_no_heldout_shapes(context):
    text = system_prompt(context)
    for task in all_tasks():
        assert not [m for m in heldout_markers(task) if m in text]


def test_heldout_tasks_never_get_a_prompt():
    for task in HELDOUT_TASKS:
        with pytest.raises(ValueError, match="held out"):
            task_prompt(task)


def _row(task: str, feedback: str = "wrong values", split: str = "train") -> dict:
    return {"id": "x", "task": task, "case_split": split,
            "messages": [{"role": "user", "content": "prompt"}, {"role": "user", "content": feedback}]}


def test_check_clean_catches_each_kind_of_leak():
    check_clean(_row("matmul"))
    matmul = get_task("matmul")
    with pytest.raises(ContaminationError, match="held-out case"):
        check_clean(_row("matmul", feedback="failed at " + heldout_markers(matmul)[0]))
    with pytest.raises(ContaminationError, match="split"):
        check_clean(_row("matmul", split="heldout"))
    with pytest.raises(ContaminationError, match="held out"):
        check_clean(_row(HELDOUT_TASKS[0].name))
    with pytest.raises(ContaminationError, match="names held-out task"):
        check_clean(_row("matmul", feedback=f"see `{HELDOUT_TASKS[0].name}`"))
