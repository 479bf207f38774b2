"""Grading at the speed of the kernel: full checks on the first seed, cheaper ones after it,
run limits that follow the work, and host work done while the worker runs.

benchmarks/grading_profile.py and benchmarks/seed_checks_agreement.py hold the figures; these
tests hold the behaviour.
"""
import dataclasses
import threading
import time

import jax
import numpy as np
import pytest

from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.execution import step_limits
from evaluator.execution.handlers import _cheap_after
from evaluator.execution.protocol import SeedResult
from evaluator.execution.sandbox import Limits
from evaluator.grader import Evaluator
from evaluator.truth.reference import ReferenceCache
from tasks import get_task
from tests.conftest import TESTS, read_candidate


def _summary(candidate: str, task_name: str, case_index: int = 0):
    """The structure stage's summary of a candidate at one check case, traced here."""
    namespace: dict = {}
    exec(compile(read_candidate(candidate), candidate, "exec"), namespace)
    task = get_task(task_name)
    case = task.select("train", "check")[case_index]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in task.arg_specs(case)]
    return summarize(jax.make_jaxpr(namespace["kernel"])(*specs)), case


# --- the run limit --------------------------------------------------------------------------
def test_a_per_step_scan_counts_every_loop_iteration():
    summary, case = _summary("correct_step_scan", "linear_recurrence")
    (call,) = summary.pallas_calls
    chunk = min(256, case.dims["T"])
    # x_t, a_t, b_t, c_t loaded and y_t stored at every one of the chunk's time steps.
    assert call.accesses_per_step >= 5 * chunk
    steps, accesses = step_limits.interpret_work(summary)
    assert steps == call.grid_steps and accesses == steps * call.accesses_per_step


def test_the_limit_grows_with_the_work_and_stops_at_the_ceiling():
    summary, _ = _summary("correct_step_scan", "linear_recurrence")
    two_seeds = step_limits.run_limit(summary, 2, base_s=120, ceiling_s=900)
    assert 120 < two_seeds.seconds < 900 and not two_seeds.capped
    assert step_limits.run_limit(summary, 4, 120, 900).seconds > two_seeds.seconds
    capped = step_limits.run_limit(summary, 2, base_s=120, ceiling_s=150)
    assert capped.seconds == 150 and capped.capped
    assert "ceiling" in capped.describe() and "memory accesses" in two_seeds.describe()


def test_the_race_detector_is_granted_time_quadratic_in_a_calls_accesses():
    """moe_unpermute's solution at its f32 coverage size (320 tokens, 4 of 60 experts) ran 90 s
    here under jax's own race check (4.5 s without the detector): a limit linear in its accesses
    granted 190 s, which a loaded CI machine ran past. The worker's check (jax_hooks.AccessLog)
    runs it in 6 s; the quadratic term stays for kernels whose copies race the core's clock."""
    namespace: dict = {}
    exec(compile(get_task("moe_unpermute").solution_source(), "solution", "exec"), namespace)
    f32, i32 = jax.numpy.float32, jax.numpy.int32
    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in
             [((1280, 448), f32), ((320, 4), i32), ((320, 4), f32), ((60,), i32)]]
    summary = summarize(jax.make_jaxpr(namespace["kernel"])(*specs))
    (call,) = summary.pallas_calls
    assert call.races_possible  # its f32 rows are copied by DMA
    accesses = call.grid_steps * call.accesses_per_step
    assert step_limits.race_detector_s(summary) == pytest.approx(step_limits.RACE_PAIR_S * accesses ** 2)
    limit = step_limits.run_limit(summary, 1, base_s=120, ceiling_s=900)
    assert limit.seconds >= 120 + step_limits.SAFETY * 6 and "race detector on" in limit.describe()
    scan, _ = _summary("correct_step_scan", "linear_recurrence")  # no DMA: no race detector
    assert step_limits.race_detector_s(scan) == 0.0


def test_a_loop_with_no_known_end_keeps_the_base_limit():
    summary, _ = _summary("timeout_kernel_loop", "matmul")
    limit = step_limits.run_limit(summary, 2, base_s=8, ceiling_s=900)
    assert limit.seconds < 9  # its while loop counts once: a hang is not granted the ceiling


@pytest.fixture(scope="module")
def short_base():
    """A base step limit shorter than one seed of the scan takes: only the work-scaled run
    limit lets it finish."""
    with Evaluator(workers=1, limits=Limits(step_timeout_s=6)) as ev:
        yield ev


@pytest.mark.slow
def test_a_sequential_scan_is_graded_correct_on_the_limit_its_work_earns(short_base):
    verdict = short_base.grade("linear_recurrence", read_candidate("correct_step_scan"), seed=1)
    assert verdict.status == "correct", verdict.message
    assert all(case.limit_s > 6 for case in verdict.cases)
    own = _own(verdict)  # two seeds each; a stress or coverage case one (a stress case runs its check case's program)
    assert all(case.compile_s > 0 and len(case.seed_run_s) == 2 for case in own)
    assert all(len(case.seed_run_s) == 1 for case in verdict.cases if case not in own)


# --- the seeds' checks ------------------------------------------------------------------------
MANUAL_DMA = (TESTS / "honest" / "matmul_manual_dma.py").read_text()  # starts its own DMAs


@pytest.fixture(scope="module")
def cheap_seeds():
    with Evaluator(workers=1, seed_checks="cheap") as ev:
        yield ev


def _own(verdict) -> list:
    """The verdict's results on the task's own check cases (two seeds each)."""
    own = {c.name for c in get_task(verdict.task).select(verdict.split, "check")}
    return [c for c in verdict.cases if c.name in own]


def _checks(verdict) -> set[tuple[str, ...]]:
    """The checks each seed of the task's own cases ran under; a stress or coverage case runs
    one seed, under its first seed's checks."""
    firsts = {tuple(c.seed_checks) for c in verdict.cases if c not in _own(verdict)}
    assert all(len(checks) == 1 for checks in firsts), firsts
    return {tuple(c.seed_checks) for c in _own(verdict)}


def test_a_kernel_without_dmas_runs_without_the_race_detector(full_evaluator):
    """Nothing can race the core's own accesses: the detector would find nothing."""
    verdict = full_evaluator.grade("softmax", get_task("softmax").solution_source(), seed=3)
    assert verdict.status == "correct", verdict.message
    assert _checks(verdict) == {("no race detection", "no race detection")}
    # Where the time went is in the record (benchmarks/grading_profile.py reads it).
    case = verdict.cases[0]
    assert case.run_s == pytest.approx(case.compile_s + sum(case.seed_run_s))
    assert case.reference_s is not None and case.compare_s is not None


def test_a_dma_kernel_runs_the_detector_on_its_first_seed_and_on_the_others_when_cheaper(full_evaluator):
    verdict = full_evaluator.grade("matmul", MANUAL_DMA, seed=3)
    assert verdict.status == "correct", verdict.message
    for case in verdict.cases:
        assert case.seed_checks[0] == "full"
        assert case.seed_checks[1] in ("full", "no race detection")
        if case.seed_checks[1] == "full":  # kept: the first seed ran no longer than its compile
            assert case.seed_run_s[0] <= case.compile_s


def test_cheap_seeds_run_after_a_first_seed_with_every_check(cheap_seeds):
    verdict = cheap_seeds.grade("matmul", MANUAL_DMA, seed=3)
    assert verdict.status == "correct", verdict.message
    assert _checks(verdict) == {("full", "no race detection")}


def test_a_race_is_caught_on_the_first_seed_whatever_the_others_run(cheap_seeds):
    verdict = cheap_seeds.grade("softmax", read_candidate("runtime_error_data_race"), seed=3)
    assert verdict.status == "runtime_error" and "race" in verdict.message
    assert verdict.cases[0].seed_checks == ["full"]


def test_full_seed_checks_run_the_detector_on_every_seed_of_every_kernel():
    with Evaluator(workers=1, seed_checks="full") as ev:
        verdict = ev.grade("softmax", get_task("softmax").solution_source(), seed=3)
    assert verdict.status == "correct" and _checks(verdict) == {("full", "full")}


def test_auto_drops_the_detector_after_the_first_seed_only_where_that_is_cheaper():
    fast, slow = SeedResult(True, seconds=0.05), SeedResult(True, seconds=9.0)
    assert not _cheap_after("auto", fast, compile_s=0.4)
    assert _cheap_after("auto", slow, compile_s=0.4)
    assert _cheap_after("cheap", fast, compile_s=0.4)
    assert not _cheap_after("full", slow, compile_s=0.4)
    assert not _cheap_after("cheap", SeedResult(False, "IndexError", "out of bounds"), compile_s=0.4)


def test_an_unknown_seed_checks_setting_is_refused():
    with pytest.raises(ValueError, match="seed_checks"):
        Evaluator(seed_checks="sometimes")


# --- host work beside the worker's -----------------------------------------------------------
def test_expected_outputs_are_made_once_when_two_threads_ask_together():
    made = []
    task = get_task("softmax")

    def slow_inputs(case, rng):
        made.append(case.name)
        time.sleep(0.2)
        return task.make_inputs(case, rng)

    counted = dataclasses.replace(task, make_inputs=slow_inputs)
    refs, case = ReferenceCache(), counted.select("train", "check")[0]
    results = []
    threads = [threading.Thread(target=lambda: results.append(refs.outputs_for(counted, case, 7)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [case.name]
    assert np.array_equal(results[0][0], results[1][0])
    assert refs.inputs(counted, case, 7) is refs.inputs(counted, case, 7)


def test_values_made_ahead_are_the_ones_the_stages_then_use():
    """ReferenceCache.ahead makes what a grading will ask for while its worker traces: each
    value once, and the stages' own requests find it made."""
    made = []
    task = get_task("softmax")

    def counted_inputs(case, rng):
        made.append(case.name)
        return task.make_inputs(case, rng)

    counted = dataclasses.replace(task, make_inputs=counted_inputs)
    refs = ReferenceCache()
    plan = [(case, [3, 4]) for case in counted.select("train", "check")]
    for job in refs.ahead(counted, counted.select("train"), plan):
        job.result()
    assert sorted(made) == sorted(case.name for case, seeds in plan for _ in seeds)
    for case, seeds in plan:
        for seed in seeds:
            inputs = refs.inputs(counted, case, seed)
            expected = refs.outputs(counted, case, inputs)
            assert all(np.array_equal(a, b) for a, b in zip(refs.outputs_for(counted, case, seed), expected))
    assert len(made) == 2 * len(plan)  # nothing made twice


def test_a_value_that_fails_ahead_fails_where_the_stage_asks_for_it():
    task = get_task("softmax")

    def broken_inputs(case, rng):
        raise RuntimeError("no inputs today")

    broken = dataclasses.replace(task, make_inputs=broken_inputs)
    refs, case = ReferenceCache(), broken.select("train", "check")[0]
    jobs = refs.ahead(broken, [], [(case, [1])])
    assert [job.result() for job in jobs] == [None]  # the background thread keeps its peace
    with pytest.raises(RuntimeError, match="no inputs today"):
        refs.inputs(broken, case, 1)
