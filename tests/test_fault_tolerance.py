"""Faulty candidates become verdicts in bounded time; a batch always yields every record."""
import dataclasses
import time

import pytest

from evaluator.execution.sandbox import Limits
from evaluator.grader import Evaluator, Job
from tasks import get_task
from tests.conftest import TESTS, read_candidate


def test_a_dma_deadlock_is_a_runtime_error_at_once(quick_timeout_evaluator):
    """A wait nothing can signal fails when it is reached, not at the worker's time limit
    (8 s here, 120 s by default)."""
    verdict = quick_timeout_evaluator.grade("matmul", read_candidate("runtime_error_dma_wait_without_start"))
    assert verdict.status == "runtime_error", verdict.message
    assert "DeadlockError: deadlock: a semaphore wait needs 16384 and the semaphore holds 0" in verdict.message


def test_a_prefetch_nobody_waits_on_is_refused_and_the_same_kernel_waiting_on_all_is_correct(evaluator):
    """The red-team kernel starts one copy past its last chunk; with the guard fixed every copy
    is waited and nothing else changes: the check tells the two apart, not the values."""
    source = (TESTS / "redteam" / "prefetch_past_last_chunk_never_waited.py").read_text()
    refused = evaluator.grade("softmax", source)
    assert refused.status == "runtime_error" and "UnwaitedDMA" in refused.message, refused.message
    assert "copies queued" in refused.message
    fixed = evaluator.grade("softmax", source.replace("c + 1 <= n", "c + 1 < n"))
    assert fixed.status == "correct", fixed.message


@pytest.mark.parametrize("name,task", [
    ("wrong_output_doubled", "matmul"),
    ("policy_violation_import_os", "softmax"),
    ("work_outside_row_max", "softmax"),
])
def test_same_candidate_graded_twice_gets_the_same_verdict(evaluator, name, task):
    first = evaluator.grade(task, read_candidate(name))
    second = evaluator.grade(task, read_candidate(name))
    assert first.details["base_seed"] != second.details["base_seed"]  # fresh seeds each time
    assert first.status == second.status


def test_correct_kernel_is_stable_across_fresh_seeds(full_evaluator):
    source = get_task("softmax").solution_source()
    assert [full_evaluator.grade("softmax", source).status for _ in range(2)] == ["correct"] * 2


@pytest.mark.slow
def test_batch_of_100_with_20_percent_faulty_candidates_completes():
    faulty = [("timeout_python_loop", "matmul", "timeout"),
              ("timeout_kernel_loop", "matmul", "timeout"),
              ("runtime_error_dma_wait_without_start", "matmul", "runtime_error"),
              ("runtime_error_memory_hog", "matmul", "runtime_error")] * 5
    healthy = [("no_kernel_plain_jnp", "softmax", "no_kernel"),
               ("work_outside_dot", "matmul", "work_outside_kernel"),
               ("lowering_error_block_7x100", "matmul", "lowering_error"),
               ("policy_violation_import_os", "softmax", "policy_violation")]
    jobs, expected = [], []
    for i in range(100):
        if i % 5 == 0:
            name, task, status = faulty[i // 5]
            jobs.append(Job(task, read_candidate(name)))
        else:
            name, task, status = healthy[i % len(healthy)]
            jobs.append(Job(task, read_candidate(name)))
        expected.append(status)
    start = time.monotonic()
    with Evaluator(backend="tpu-interpret", workers=2, limits=Limits(step_timeout_s=6)) as ev:
        verdicts = ev.grade_many(jobs)
    wall = time.monotonic() - start
    print(f"100 candidates (20 faulty) graded in {wall:.0f} s")
    assert len(verdicts) == 100
    assert [v.status for v in verdicts] == expected


def test_a_runtime_error_in_any_case_replaces_the_worker():
    """A crash in a later case (after an earlier case gave wrong_output) once left its exception to
    surface in the next candidate graded on that worker; any faulted case must recycle it."""
    from data_gen.failures.mutations import mutants

    task = get_task("attention_fwd_causal")
    swapped = next(m for m in mutants(task) if m.operator == "index_map_swap")
    # Check sizes only: at bench sizes the index-maps stage refuses the swapped map before any run.
    task = dataclasses.replace(task, cases=tuple(c for c in task.cases if c.size == "check"))
    with Evaluator(backend="tpu-interpret", workers=1) as ev:
        verdict = ev.grade(task, swapped.answer(), "train", seed=0)
        assert verdict.status == "wrong_output"  # the status the verdict reports ...
        assert "runtime_error" in {c.status for c in verdict.cases}  # ... hides a crash in a later case
        worker = ev.pool._all[0]
        assert not worker.alive
        assert ev.grade(task, task.solution_source(), "train", seed=0).status == "correct"
