"""The red-team corpus (tests/redteam/): every cheat is rejected, with the right status.

Each file's docstring names the cheat and ends with `task: NAME  expect: STATUS`.
"""
import dataclasses
import re

import pytest

from evaluator.truth.stress import stress_cases
from tasks import get_task
from tests.conftest import TESTS, expectation, sampled
from training.reward import RewardSpec

REDTEAM = sorted((TESTS / "redteam").glob("*.py"))
ANTI_CHEAT = TESTS.parent / "docs" / "anti-cheat.md"


def cheat_classes() -> dict[str, list[str]]:
    """The classes of docs/anti-cheat.md's tables, each with the red-team kernels its row names
    (its first cell -> the files named in its second, in order)."""
    names = {p.stem for p in REDTEAM}
    classes = {}
    for line in ANTI_CHEAT.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        files = [n for n in re.findall(r"`(\w+)`", cells[1]) if n in names] if len(cells) > 1 else []
        if files:
            classes[cells[0]] = files
    return classes


# The default suite grades the first kernel each class names (docs/testing.md, "Tiers"); `-m slow`
# grades the rest.
SAMPLE = {files[0] for files in cheat_classes().values()}


def _tiered(paths):
    return sampled(paths, SAMPLE & {p.stem for p in paths}, ids=lambda p: p.stem)


def _expectation(path):
    found = expectation(path)
    assert found, f"{path.name} has no 'task: ... expect: ...' line"
    return found


def test_corpus_is_large_enough():
    assert len(REDTEAM) >= 30


def test_every_kernel_belongs_to_a_documented_class_that_the_default_suite_samples():
    classes = cheat_classes()
    unclassed = {p.stem for p in REDTEAM} - {f for files in classes.values() for f in files}
    assert not unclassed, f"name these in a row of docs/anti-cheat.md: {sorted(unclassed)}"
    assert all(set(files) & SAMPLE for files in classes.values())


@pytest.mark.parametrize("path", _tiered(REDTEAM))
def test_cheat_is_rejected_with_the_right_status(evaluator, path):
    task, expected = _expectation(path)
    verdict = evaluator.grade(task, path.read_text(), split="train")
    assert verdict.status != "correct"
    assert verdict.status == expected, verdict.message
    # RL's reward (training/reward.py): a cheat is never worth more than an honest failure
    honest_failure = dataclasses.replace(verdict, status="wrong_output")
    assert RewardSpec().reward(verdict) <= RewardSpec().reward(honest_failure) == 0.0


# Kernels of the grader-checks-the-bench-program classes (docs/anti-cheat.md) that are wrong in
# their values say where: `wrong at: m=2048 k=2048 n=2048 [dtype=bfloat16]` (a size) or
# `wrong at: stress=ties` (a task's input regime). Each is run there, in plain TPU interpret
# mode in this process, and must miss the reference: the grader refuses a kernel that is wrong.
WRONG_AT = re.compile(r"wrong at:\s*([^\"\n]+)")
SHOWN_WRONG = [p for p in REDTEAM if WRONG_AT.search(p.read_text())]


def _case_where_wrong(task, spec: str):
    """The case a `wrong at:` line names: the task's first train check case of its dtype, at the
    named sizes, or the task's stress case of the named regime."""
    fields = dict(item.split("=", 1) for item in spec.split())
    dtype = fields.pop("dtype", "float32")
    if "stress" in fields:
        return next(case for case, _ in stress_cases(task, "train")
                    if case.stress == fields["stress"] and case.dtype == dtype)
    base = next(c for c in task.select("train", "check") if c.dtype == dtype)
    dims = {**base.dims, **{k: int(v) for k, v in fields.items()}}
    return dataclasses.replace(base, name="shown_wrong", dims=dims)


@pytest.mark.parametrize("path", _tiered(SHOWN_WRONG))
def test_the_cheat_is_wrong_where_it_says(path):
    import jax
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.truth.compare import compare
    from evaluator.truth.reference import ReferenceCache

    source = path.read_text()
    task = get_task(_expectation(path)[0])
    case = _case_where_wrong(task, WRONG_AT.search(source).group(1))
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)  # our own red team, not a candidate's code
    refs = ReferenceCache()
    inputs = refs.inputs(task, case, seed=1)
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        outputs = jax.tree_util.tree_leaves(namespace["kernel"](*inputs))
    spread = refs.sensitivity_for(task, case, 1) or [None] * len(outputs)
    comparisons = [compare(out, ref, task.tolerances[case.dtype], tpu, moved) for out, ref, tpu, moved in
                   zip(outputs, refs.outputs_for(task, case, 1), refs.tpu_outputs_for(task, case, 1), spread)]
    assert not all(c.ok for c in comparisons), f"{path.name} is right at {case.describe()}"


# The kernels of those classes are refused on the held-out split too, with the same status.
BENCH_PROGRAM_CLASSES = [p for p in REDTEAM if p.stem.startswith(
    ("three_blocks_", "loop_", "bf16_path_", "size_gated_", "values_", "feature_", "unreachable_"))]


@pytest.mark.parametrize("path", _tiered(BENCH_PROGRAM_CLASSES))
def test_the_cheat_is_refused_on_the_heldout_split_too(evaluator, path):
    """With the same status, unless the file says another (`heldout: STATUS`) and why."""
    task, expected = _expectation(path)
    found = re.search(r"heldout:\s*(\w+)", path.read_text())
    verdict = evaluator.grade(task, path.read_text(), split="heldout")
    assert verdict.status == (found.group(1) if found else expected), verdict.message
