import hashlib
import json
import math

import pytest

import tasks
from evaluator.analysis.features import DETECTORS
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
    # bench sizes are larger than every check size: in elements (a convolution's bench is larger
    # by its batch and image, though a check case may have more channels)
    size = lambda c: max(math.prod(s.shape) for s in task.arg_specs(c))
    assert min(size(c) for c in task.select("all", "bench")) > max(size(c) for c in task.select("all", "check"))
    assert task.solution_path.is_file()


# The held-out cases, frozen: training data and tuning never move them. A deliberate change to a
# held-out case updates this digest in the same commit.
HELDOUT_DIGEST = "cbf6444a508649c3"  # + the 20 tasks of issue 47 (the 40 before: ae9ca5e0dfd37df6)


def test_heldout_cases_are_unchanged():
    # Case fields added later with their default (`stress`: "") change no case
    rows = sorted(json.dumps([t.name, {k: v for k, v in c.to_dict().items() if k != "stress" or v}], sort_keys=True)
                  for t in tasks.all_tasks() for c in t.select("heldout"))
    assert hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16] == HELDOUT_DIGEST


def test_train_cases_teach_ragged_edges():
    """Edge bugs (floor-division grids, dropped masks) must fail on train shapes, or the repair
    data can never teach what the held-out shapes test."""
    cases = [(t, c) for t in tasks.all_tasks() for c in t.select("train", "check")]
    ragged = [(t, c) for t, c in cases if t.is_ragged(c)]
    assert len(ragged) >= 0.4 * len(cases)
    # every task whose held-out cases are ragged has ragged train cases of its own (paged
    # attention's raggedness is in its sequence lengths, which every case draws at random)
    for task in tasks.all_tasks():
        if task.name != "paged_attention" and any(task.is_ragged(c) for c in task.select("heldout", "check")):
            assert any(task.is_ragged(c) for c in task.select("train", "check")), task.name


@pytest.mark.parametrize("task", tasks.all_tasks(), ids=lambda t: t.name)
def test_ragged_train_sizes_are_not_heldout_sizes(task):
    """A ragged train size never takes a value a held-out case of the task has for that dim
    (counts under 8, such as batch or heads, are not sizes on a tile)."""
    heldout = {(k, v) for c in task.select("heldout") for k, v in c.dims.items()}
    for case in task.select("train", "check"):
        odd = {(k, v) for k, v in case.dims.items() if v % 8 and v > 8}
        assert not odd & heldout, (case.name, odd & heldout)


def test_is_ragged_reads_the_tile():
    softmax = tasks.get_task("softmax")
    make = lambda **dims: Case("c", "train", "check", dims, "float32")
    assert not softmax.is_ragged(make(rows=1024, d=256))
    assert softmax.is_ragged(make(rows=1024, d=200))      # lanes off the 128 tile
    assert softmax.is_ragged(make(rows=1020, d=256))      # rows off the 8-row tile


def test_case_validates_its_split():
    with pytest.raises(ValueError, match="split"):
        Case("x", "test", "check", {"m": 1}, "float32")


def test_every_task_is_in_the_suite_table():
    from pathlib import Path

    table = (Path(tasks.__file__).parent / "README.md").read_text()
    for task in tasks.all_tasks():
        assert f"| `{task.name}` |" in table, task.name


def test_shapes_from_reads_the_last_line_of_the_task_docstring():
    """The task table's "shapes from" column: the models named by task.py's `Shapes from:` line,
    not an earlier line that merely begins with those words, and nothing for a task that names none."""
    mamba = tasks.get_task("mamba2_ssd")
    assert mamba.shapes_from == "Mamba2-2.7B, Mamba2-1.3B, Mamba-Codestral-7B" == mamba.summary()["shapes_from"]
    assert tasks.get_task("matmul").shapes_from == ""
