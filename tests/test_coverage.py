"""Coverage cases: every grid axis a kernel tiles at bench sizes runs two blocks at some check case."""
import dataclasses

from evaluator.analysis import coverage
from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
from evaluator.analysis.jaxpr_cost import Cost
from tasks import get_task
from tests.conftest import TESTS


def summary(*grids: tuple[str, list[int]]) -> TraceSummary:
    calls = [PallasCallInfo(name, grid, [], [], 0, None, None, []) for name, grid in grids]
    return TraceSummary(calls, Cost(), [])


def test_an_axis_tiled_only_at_bench_sizes_is_a_gap():
    checks = [summary(("mm", [1, 1, 1])), summary(("mm", [2, 1, 1]))]
    gaps = coverage.axis_gaps(checks, [("bench", summary(("mm", [4, 4, 4])))])
    assert {(g.kernel, g.axis) for g in gaps} == {("mm", 1), ("mm", 2)}   # axis 0 runs 2 steps at a check case


def test_a_kernel_that_runs_only_at_bench_sizes_has_every_multi_step_axis_listed():
    gaps = coverage.axis_gaps([summary(("a", [1]))], [("bench", summary(("a", [1]), ("b", [3, 1])))])
    assert [(g.kernel, g.axis, g.bench_steps) for g in gaps] == [("b", 0, 3)]


def test_repeated_kernels_are_compared_by_occurrence():
    grids = coverage.kernel_grids(summary(("k", [1]), ("k", [5])))
    assert grids == {"k": [1], "k#2": [5]}


def test_covering_size_is_two_blocks_plus_a_tail_only_where_the_task_is_ragged():
    matmul = get_task("matmul")            # m takes 1, 200, 260, 3000: ragged
    assert coverage.covering_size(matmul, "m", 4096, 4) == 2 * 1024 + 512
    aligned = dataclasses.replace(matmul, cases=tuple(
        dataclasses.replace(c, dims={**c.dims, "m": 256 * (1 + i)}) for i, c in enumerate(matmul.cases)))
    assert coverage.covering_size(aligned, "m", 4096, 4) == 2048   # every m a multiple of 256
    assert coverage.covering_size(matmul, "m", 1500, 2) == 1500     # never past the bench value


def test_the_budget_splits_a_case_per_dimension_and_reports_what_does_not_fit():
    matmul = get_task("matmul")
    base = matmul.select("train", "check")[0]
    bench = matmul.select("train", "bench")[0]
    sizes = {"m": 2560, "k": 2560}
    one, skipped = coverage.plan_cases(matmul, base, bench, sizes, max_elements=10 ** 9)
    assert [c.dims for c in one] == [{**base.dims, **sizes}] and not skipped
    apart, skipped = coverage.plan_cases(matmul, base, bench, sizes, max_elements=coverage.elements(
        matmul, coverage.derived_case(base, bench, {"m": 2560})))
    assert [c.dims for c in apart] == [{**base.dims, "m": 2560}, {**base.dims, "k": 2560}] and not skipped
    none, skipped = coverage.plan_cases(matmul, base, bench, {"m": 2560}, max_elements=10)
    assert none == [] and "m=2560" in skipped[0]


def test_the_matmul_solution_runs_every_tiled_axis_in_two_blocks(evaluator):
    """Static stages only: the derived cases are traced and each closes its gap."""
    task = get_task("matmul")
    verdict = evaluator.grade(task, task.solution_source(), split="train", seed=0, through="coverage")
    cov = verdict.details["coverage"]
    assert len(cov["gaps"]) == 3 and not cov["uncovered"]
    steps = cov["steps"]
    for axis in range(3):
        assert any(grid["matmul_kernel"][axis] >= 2 for name, grid in steps.items() if "_cover_" in name)
    for added in cov["added"]:
        assert added["from"] == "train_bench_m4096_k4096_n4096_f32" and added["runs"]


def test_a_bug_that_needs_two_blocks_is_found_on_a_coverage_case_and_the_feedback_says_why(evaluator):
    code = (TESTS / "redteam" / "two_blocks_accumulator_zeroed_once.py").read_text()
    verdict = evaluator.grade("matmul", code, split="train", seed=0)
    assert verdict.status == "wrong_output"
    failed = [c for c in verdict.cases if c.status != "correct"]
    assert failed and all("_cover_" in c.name for c in failed)
    assert "more than one block runs" in verdict.message and "accumulator" in verdict.message
