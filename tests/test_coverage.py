"""Coverage cases: every grid axis and loop bench sizes iterate runs three steps at some run case,
in every bench dtype."""
import dataclasses

from evaluator.analysis import coverage
from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
from evaluator.analysis.jaxpr_cost import Cost
from tasks import get_task
from tasks.spec import Case
from tests.conftest import TESTS


def summary(*grids: tuple[str, list[int]], loops: list[int] | None = None) -> TraceSummary:
    calls = [PallasCallInfo(name, grid, [], [], 0, None, None, [], loop_trips=list(loops or []))
             for name, grid in grids]
    return TraceSummary(calls, Cost(), [])


BENCH = Case("bench", "train", "bench", {"m": 4096}, "float32")


def test_a_space_the_checks_run_fewer_than_three_steps_is_a_gap():
    checks = [("float32", summary(("mm", [1, 1, 1]))), ("float32", summary(("mm", [2, 1, 3])))]
    gaps = coverage.axis_gaps(checks, [(BENCH, summary(("mm", [4, 4, 4])))])
    # axis 0 runs 2 steps at a check case: the third step, the first to read a carry written by
    # a step that read one, never ran; axis 2 runs 3 there
    assert {(g.kernel, g.space) for g in gaps} == {("mm", "axis 0"), ("mm", "axis 1")}
    two = coverage.axis_gaps(checks, [(BENCH, summary(("mm", [2, 1, 1])))])
    assert two == []  # two steps at the bench size: the check case's two are all there is


def test_loops_inside_the_kernel_are_spaces_like_grid_axes():
    checks = [("float32", summary(("attn", [4]), loops=[1, 8]))]
    gaps = coverage.axis_gaps(checks, [(BENCH, summary(("attn", [4]), loops=[16, 8]))])
    assert [(g.space, g.bench_steps, g.needed) for g in gaps] == [("loop 0", 16, 3)]
    assert coverage.spaces(summary(("attn", [4]), loops=[-1, 8])) == {"attn": {"axis 0": 4, "loop 1": 8}}


def test_a_branch_the_bench_takes_and_no_check_case_takes_is_a_gap():
    """A pl.when skipped on some bench steps only (the last eighth of the K blocks) is a path
    the check cases never take; a probe that takes it closes the gap."""
    def branching(taken: list[list[int] | None]) -> TraceSummary:
        call = PallasCallInfo("mm", [1, 1, 2], [], [], 0, None, None, [], branches=taken)
        return TraceSummary([call], Cost(), [])

    checks = [("float32", branching([[1], None]))]
    gaps = coverage.axis_gaps(checks, [(BENCH, branching([[0, 1], None]))])
    assert [(g.space, g.needed) for g in gaps] == [("cond 0 branch 0", 1)]
    assert "branch 0 of cond 0 in mm" in gaps[0].describe()
    assert coverage.drives(branching([[0, 1], None]), gaps) == [(gaps[0], 1)]
    assert coverage.drives(branching([[1], None]), gaps) == []


def test_every_bench_dtype_gets_its_own_gaps():
    """A bf16 path must run its steps in bf16: an f32 check case does not cover it."""
    checks = [("float32", summary(("k", [4]))), ("bfloat16", summary(("k", [1])))]
    benches = [(BENCH, summary(("k", [8]))),
               (dataclasses.replace(BENCH, name="bench_bf16", dtype="bfloat16"), summary(("k", [8])))]
    gaps = coverage.axis_gaps(checks, benches)
    assert [(g.bench, g.dtype) for g in gaps] == [("bench_bf16", "bfloat16")]


def test_a_kernel_that_runs_only_at_bench_sizes_has_every_multi_step_space_listed():
    gaps = coverage.axis_gaps([("float32", summary(("a", [1])))], [(BENCH, summary(("a", [1]), ("b", [3, 1])))])
    assert [(g.kernel, g.space, g.bench_steps) for g in gaps] == [("b", "axis 0", 3)]


def test_repeated_kernels_are_compared_by_occurrence():
    assert coverage.spaces(summary(("k", [1]), ("k", [5]))) == {"k": {"axis 0": 1}, "k#2": {"axis 0": 5}}


def test_covering_size_is_three_steps_the_last_partial_where_the_task_is_ragged():
    matmul = get_task("matmul")            # m takes 1, 200, 260, 3000: ragged
    assert coverage.covering_size(matmul, "m", 4096, 4) == 2 * 1024 + 512
    aligned = dataclasses.replace(matmul, cases=tuple(
        dataclasses.replace(c, dims={**c.dims, "m": 256 * (1 + i)}) for i, c in enumerate(matmul.cases)))
    assert coverage.covering_size(aligned, "m", 4096, 4) == 3072   # every m a multiple of 256
    assert coverage.covering_size(matmul, "m", 1500, 2) == 1500     # never past the bench value


def test_a_dimension_is_chosen_only_where_its_probe_moves_the_space():
    """The probe of a dimension that does not drive a space still shows the steps the base case
    runs there; only a probe that runs more of them than the base drives it."""
    task = get_task("matmul")
    base = task.select("train", "check")[0]
    bench = task.select("train", "bench")[0]
    gap = coverage.AxisGap("mm", "axis 1", bench.name, 4, bench.dtype)
    at_base = summary(("mm", [1, 2, 1]))
    probes = {"m": summary(("mm", [4, 2, 1])), "n": summary(("mm", [1, 4, 1]))}
    assert coverage.choose_sizes(task, base, bench, [gap], at_base, probes) == {"n": 2 * 1024 + 512}  # ragged: a tail


def test_a_space_two_dimensions_drive_together_is_found_by_a_joint_probe():
    task = get_task("grouped_matmul")
    base = task.select("train", "check")[0]
    bench = task.select("train", "bench")[0]
    joint = coverage.joint_probes(base, bench)
    assert set(joint) == {d for d in bench.dims if base.dims[d] != bench.dims[d]}
    for left_out, probe in joint.items():
        assert probe.dims[left_out] == base.dims[left_out]
        assert all(probe.dims[d] == bench.dims[d] for d in joint if d != left_out)
    gap = coverage.AxisGap("gmm", "axis 0", bench.name, 2, bench.dtype)
    moved = {dim: (case, summary(("gmm", [2 if dim == "m" else 1]))) for dim, case in joint.items()}
    cases, left = coverage.cases_from_probes(task, bench, [gap], moved, max_elements=10 ** 9)
    assert [c.dims for c in cases] == [joint["m"].dims] and not left
    none, left = coverage.cases_from_probes(task, bench, [gap], moved, max_elements=10)
    assert none == [] and left == [gap]


def test_a_probe_at_an_evenly_divided_bench_value_gets_a_ragged_twin_that_is_preferred():
    """softmax's d takes 256, 448, 4096, ...: ragged. A kernel whose blocks along d jump at some
    size runs 8 steps only at the bench value 4096, which 512 divides: a tail dropped (a floor
    for a ceiling) is wrong only at a d with a partial last block, so the probe less half a
    block is traced too, and the smaller that still runs the gap's steps is the one run."""
    task = get_task("softmax")
    base = task.select("train", "check")[0]
    bench = task.select("train", "bench")[0]
    gap = coverage.AxisGap("sm", "axis 1", bench.name, 8, bench.dtype)
    probe = dataclasses.replace(base, name="probe", dims={**base.dims, "d": bench.dims["d"]})
    twins = coverage.ragged_probes(task, [gap], {"d": (probe, summary(("sm", [4, 8])))})
    assert [t.dims["d"] for t in twins.values()] == [bench.dims["d"] - 256]
    assert coverage.ragged_probes(task, [gap], {"d": (probe, summary(("sm", [4, 1])))}) == {}  # no steps
    traced = {"d": (probe, summary(("sm", [4, 8]))), "d ragged": (twins["d ragged"], summary(("sm", [4, 8])))}
    cases, _ = coverage.cases_from_probes(task, bench, [gap], traced, max_elements=10 ** 9)
    assert [c.dims["d"] for c in cases] == [bench.dims["d"] - 256]


def test_the_budget_splits_a_case_per_dimension_and_reports_what_does_not_fit():
    matmul = get_task("matmul")
    base = matmul.select("train", "check")[0]
    bench = matmul.select("train", "bench")[0]
    sizes = {"m": 2560, "k": 2560}
    one, skipped = coverage.plan_cases(matmul, base, bench, sizes, max_elements=10 ** 9)
    assert [c.dims for c in one] == [{**base.dims, **sizes}] and not skipped
    apart, skipped = coverage.plan_cases(matmul, base, bench, sizes, max_elements=coverage.elements(
        matmul, coverage.derived_case(matmul, base, bench, {"m": 2560})))
    assert [c.dims for c in apart] == [{**base.dims, "m": 2560}, {**base.dims, "k": 2560}] and not skipped
    none, skipped = coverage.plan_cases(matmul, base, bench, {"m": 2560}, max_elements=10)
    assert none == [] and "m=2560" in skipped[0]


def test_the_matmul_solution_runs_every_tiled_axis_three_blocks_in_every_dtype(evaluator):
    """Static stages only: the derived cases are traced and each closes its gap, the branches
    bench sizes take included."""
    task = get_task("matmul")
    verdict = evaluator.grade(task, task.solution_source(), split="train", seed=0, through="coverage")
    cov = verdict.details["coverage"]
    axes = [g for g in cov["gaps"] if g.startswith("axis")]
    assert len(axes) == 6 and not cov["uncovered"]  # three axes, two dtypes
    # the accumulator's init and write-back are skipped on some K steps at the bench size only
    assert {g.split(" (")[0] for g in cov["gaps"] if g.startswith("branch")} == {
        "branch 0 of cond 0 in matmul_kernel", "branch 0 of cond 1 in matmul_kernel"}
    steps = cov["steps"]
    for dtype in ("f32", "bf16"):
        for axis in range(3):
            assert any(spaces["matmul_kernel"][f"axis {axis}"] >= 3 for name, spaces in steps.items()
                       if "_cover_" in name and name.endswith(dtype))
    for added in cov["added"]:
        assert added["from"].startswith("train_bench_m4096_k4096_n4096_") and added["runs"]


def test_a_bug_that_needs_several_blocks_is_found_on_a_coverage_case_and_the_feedback_says_why(evaluator):
    code = (TESTS / "redteam" / "two_blocks_accumulator_zeroed_once.py").read_text()
    verdict = evaluator.grade("matmul", code, split="train", seed=0)
    assert verdict.status == "wrong_output"
    failed = [c for c in verdict.cases if c.status != "correct"]
    assert failed and all("_cover_" in c.name for c in failed)
    assert "runs several steps" in verdict.message and "accumulator" in verdict.message
