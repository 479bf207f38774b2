"""Every failure status, produced by a real broken candidate (tests/candidates/)."""
import json

import pytest

from data_gen.rows.explanations import observed_facts
from evaluator.performance.hardware import MiB
from evaluator.record import STATUSES, Status, Verdict
from evaluator.stages import Failure
from tests.conftest import CANDIDATES, expectation, read_candidate, sampled


# Each broken candidate of tests/candidates/ that stands for a status says which, and on which
# task, on its last line (`# task: matmul  expect: wrong_output`). A new status needs one such file.
def _expected() -> list[tuple[str, str, str]]:
    """(candidate file, task, expected status) for every candidate that says what it expects."""
    return [(path.stem, *found) for path in sorted(CANDIDATES.glob("*.py")) if (found := expectation(path))]


CASES = [case for case in _expected() if case[2] != "timeout"]
TIMEOUTS = [(name, task) for name, task, status in _expected() if status == "timeout"]


@pytest.mark.parametrize("name,task,status", CASES, ids=[c[0] for c in CASES])
def test_broken_candidate_gets_its_status(evaluator, name, task, status):
    verdict = evaluator.grade(task, read_candidate(name), split="train")
    assert verdict.status == status, verdict.message
    assert verdict.message.startswith(status)


# The default suite times out one hang (a Python loop); `-m slow` the others (docs/testing.md, "Tiers").
@pytest.mark.parametrize("name,task", sampled(TIMEOUTS, {"timeout_python_loop"}, ids=lambda t: t[0]))
def test_hanging_candidate_times_out_and_next_one_is_graded(quick_timeout_evaluator, name, task):
    verdict = quick_timeout_evaluator.grade(task, read_candidate(name), split="train")
    assert verdict.status == "timeout", verdict.message
    assert verdict.wall_s < 60
    if verdict.stage == "run":  # a hang in the kernel: the verdict says what limit applied
        assert "its limit: the step limit of 8 s" in verdict.message, verdict.message
    # the pool replaced the killed worker: an honest kernel is graded normally afterwards
    again = quick_timeout_evaluator.grade("softmax", read_candidate("no_kernel_plain_jnp"))
    assert again.status == "no_kernel"


def test_extraction_error_for_an_answer_without_code(evaluator):
    verdict = evaluator.grade("matmul", "I am sorry, I cannot write this kernel.")
    assert verdict.status == "extraction_error"


def test_every_failure_status_is_covered():
    covered = {c[2] for c in CASES} | {"timeout", "extraction_error", "correct"}
    assert covered == set(STATUSES)


def test_memory_exhaustion_does_not_poison_the_next_grading(evaluator):
    hog = evaluator.grade("matmul", read_candidate("runtime_error_memory_hog"))
    assert hog.status == "runtime_error"
    from tasks import get_task

    good = evaluator.grade("matmul", get_task("matmul").solution_source(), split="train")
    assert good.status == "correct", good.message


def test_feedback_names_case_and_error_metrics(evaluator):
    verdict = evaluator.grade("matmul", read_candidate("wrong_output_doubled"))
    assert "train_check_" in verdict.message
    assert "relative L2 error" in verdict.message and "max abs error" in verdict.message
    failing = [c for c in verdict.cases if c.status == "wrong_output"]
    assert failing and failing[0].rel_l2_err == pytest.approx(1.0, abs=1e-2)  # twice the product
    assert len(verdict.message) < 800


def test_runtime_error_feedback_has_the_real_error(evaluator):
    verdict = evaluator.grade("matmul", read_candidate("runtime_error_index_map_out_of_range"))
    assert "Out-of-bounds block index" in verdict.message
    assert verdict.error_type == "IndexError"


def test_a_vmem_overflow_carries_its_figures_as_numbers(evaluator):
    """What later consumers need is typed on the verdict (never read back from the message), and
    survives a journal's JSON round trip."""
    verdict = evaluator.grade("matmul", read_candidate("compile_error_vmem_overflow"), seed=0)
    vmem, case = verdict.vmem, verdict.failing_case
    assert verdict.status == Status.COMPILE_ERROR and vmem is not None and case is not None
    assert vmem.need_bytes > vmem.limit_bytes and vmem.case == case.name and vmem.blocks
    assert f"{vmem.need_bytes / MiB:.1f} MiB" in verdict.message and case.sizes() in verdict.message
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
    facts = observed_facts(verdict)
    assert (facts["need_mib"], facts["limit_mib"], facts["case"]) == (
        f"{vmem.need_bytes / MiB:.0f}", f"{vmem.limit_bytes / MiB:.0f}", case.sizes())


def test_a_status_outside_the_one_list_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="not_a_status"):
        Failure("not_a_status", "a typo in a stage")
    assert set(STATUSES) == {s.value for s in Status} - {"pending"}
