import pytest

import tasks
from evaluator.features import DETECTORS
from tasks.spec import KNOWN_FEATURES, Case

REQUIRED_TASKS = {"matmul", "softmax", "rms_norm", "attention_fwd", "attention_fwd_causal",
                  "grouped_matmul"}


def test_the_design_tasks_are_registered():
    assert REQUIRED_TASKS <= {t.name for t in tasks.all_tasks()}


def test_unknown_task_suggests_near_matches():
    with pytest.raises(tasks.UnknownTaskError, match="did you mean attention_fwd_causal"):
        tasks.get_task("attention_fwd_casual")


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="registered twice"):
        tasks.register(tasks.get_task("matmul"))


def test_feature_names_match_the_evaluators_detectors():
    assert set(KNOWN_FEATURES) == set(DETECTORS)


@pytest.mark.parametrize("task", tasks.all_tasks(), ids=lambda t: t.name)
def test_task_contract(task):
    assert {"float32", "bfloat16"} <= set(task.dtypes)
    for split in ("train", "heldout"):
        assert task.select(split, "check") and task.select(split, "bench")
    # Held-out shapes differ in kind: none of them is a train shape.
    train_dims = {tuple(sorted(c.dims.items())) for c in task.select("train")}
    assert all(tuple(sorted(c.dims.items())) not in train_dims for c in task.select("heldout"))
    # bench sizes are larger than every check size
    size = lambda c: max(max(s.shape) for s in task.arg_specs(c))
    assert min(size(c) for c in task.select("all", "bench")) > max(size(c) for c in task.select("all", "check"))
    assert task.solution_path.is_file()


def test_case_validates_its_split():
    with pytest.raises(ValueError, match="split"):
        Case("x", "test", "check", {"m": 1}, "float32")


def test_every_task_is_in_the_suite_table():
    from pathlib import Path

    table = (Path(tasks.__file__).parent / "README.md").read_text()
    for task in tasks.all_tasks():
        assert f"| `{task.name}` |" in table, task.name


def test_the_performance_table_is_current(capsys):
    """tasks/README.md's performance table is what `python -m evaluator estimate --markdown`
    prints for the solutions as they are: regenerate it when a solution changes."""
    from pathlib import Path

    from evaluator.cli import main

    text = (Path(tasks.__file__).parent / "README.md").read_text()
    section = text.split("\n## Performance", 1)[1].split("\n## ", 1)[0]
    committed = [line for line in section.splitlines() if line.startswith("|")]
    assert main(["estimate", "--markdown"]) == 0
    generated = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert committed == generated
