"""The repair search (data_gen/repairs/repair_search.py): which answers it leaves alone, how it spends
its budget, which edits it keeps, and an explanation made of exactly those edits."""
import pytest

from data_gen.repairs import repair_search
from evaluator.record import Verdict
from tasks import get_task

SOLUTION = get_task("softmax").solution_source()


def verdict(status: str, message: str, stage: str) -> Verdict:
    return Verdict(task="softmax", task_version=1, status=status, message=f"{status}: {message}",
                   backend="tpu-interpret", split="train", stage=stage)


CORRECT = verdict("correct", "all cases passed", "done")
NO_JNP = verdict("lowering_error", "tracing kernel() failed: NameError: name 'jnp' is not defined", "trace")


def without_jnp(source: str) -> str:
    return source.replace("import jax.numpy as jnp\n", "")


@pytest.mark.parametrize("cut, expected", [
    (lambda s: s[: s.index("pl.pallas_call(") + len("pl.pallas_call(")], True),   # an open bracket at the end
    (lambda s: s.rstrip() + "\n\ndef helper(x):\n", True),                         # a block with no body at the end
    (lambda s: s.replace("import jax\n", "import jax\nx = = 1\n", 1), False),      # a typo early on: not a cut
    (lambda s: s, False),
])
def test_truncated_answers_are_recognised(cut, expected):
    code = cut(SOLUTION)
    assert repair_search.truncated(code, verdict("syntax_error", "invalid syntax", "policy")) is expected


def test_an_open_fence_is_a_truncation_whatever_the_code():
    cut = verdict("extraction_error", "the answer ends inside a ```python block that never closes: it was cut off "
                  "before its code was complete (a truncated answer)", "extract")
    assert repair_search.truncated(SOLUTION, cut)


def test_the_search_applies_the_named_kinds_repairer_and_stops_when_correct():
    graded = []

    def grade(source: str) -> Verdict:
        graded.append(source)
        return CORRECT if "import jax.numpy as jnp" in source else NO_JNP

    found = repair_search.search(without_jnp(SOLUTION), NO_JNP, grade, budget=4)
    assert found.repaired and found.gradings == 1 and len(graded) == 1
    assert [(e.kind, e.repairer) for e in found.edits] == [("undefined_name", "undefined_name")]
    text = repair_search.explain(found.edits)
    assert text.startswith("One fix makes the kernel correct:") and "add `import jax.numpy as jnp`" in text


def test_an_edit_the_grader_sees_no_change_in_is_undone_and_the_budget_holds():
    """Every grading says the same: no edit is kept, and no more than `budget` gradings are spent."""
    calls = []

    def grade(source: str) -> Verdict:
        calls.append(source)
        return NO_JNP

    found = repair_search.search(without_jnp(SOLUTION), NO_JNP, grade, budget=1)
    assert not found.repaired and found.edits == [] and len(calls) == found.gradings == 1
    assert found.code == without_jnp(SOLUTION)


def test_a_failure_at_a_later_stage_is_progress_an_earlier_one_is_not():
    late = verdict("wrong_output", "values differ", "run")
    early = verdict("syntax_error", "invalid syntax", "policy")
    assert repair_search._progress(NO_JNP, late) and not repair_search._progress(late, early)
    assert repair_search._progress(late, verdict("wrong_output", "other values differ", "run"))
    assert not repair_search._progress(late, late)


def test_the_explanation_lists_every_kept_edit_in_order_with_its_lines():
    first = repair_search.Edit("undefined_name", "undefined_name", "lowering_error", "a = 1\nb = 2\n",
                               "import jax.numpy as jnp\na = 1\nb = 2\n")
    second = repair_search.Edit("shape_error", "shape_error", "lowering_error", first.after,
                                "import jax.numpy as jnp\na = 1\nb = 128\n")  # an edit no describer tells
    text = repair_search.explain([first, second])
    lines = text.splitlines()
    assert lines[0].startswith("2 fixes")
    assert lines[1] == "1. A name used but never imported or defined. Fix: add `import jax.numpy as jnp`."
    assert lines[2].startswith("2. Shapes that do not agree") and lines[2].endswith(
        "Fix: write `b = 128` in place of `b = 2`.")
