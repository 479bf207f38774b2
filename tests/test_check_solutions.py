"""Every task's hand-written solution is correct on train and held-out cases.

One test per task: the default suite grades the sample tasks (tests/conftest.py SAMPLE_TASKS),
`pytest -m slow` the rest. The static verdicts are kept in the test run's shared verdict cache
(`shared_verdicts`), where the performance checks below read them back instead of grading
every solution again.
"""
from pathlib import Path

import pytest

import tasks
from evaluator.grader import Evaluator
from evaluator.stages import LAST_STATIC_STAGE
from evaluator.truth.stress import stress_cases
from tasks import all_tasks
from tests.conftest import SAMPLE_TASKS, sampled

SUITE = all_tasks()
PER_TASK = sampled(SUITE, SAMPLE_TASKS, ids=lambda t: t.name)


@pytest.mark.parametrize("task", PER_TASK)
def test_every_solution_is_correct_on_all_splits(evaluator, task):
    """One seed per case: every case, stress case and coverage case of every split still runs
    (stopping at a failing case changes nothing for a kernel that must have none); the
    verdicts' stability over seeds is tests/test_seed_stability.py's (and
    benchmarks/seed_stability.py's)."""
    verdict = evaluator.grade(task, task.solution_source(), "all")
    assert verdict.status == "correct", verdict.message
    ran = {c.name for c in verdict.cases}
    own = {c.name for c in task.select("all", "check")}
    added = {a["case"] for a in verdict.details["coverage"]["added"]}
    stressed = {c.name for c, _ in stress_cases(task, "all")}
    assert ran == own | stressed | added and all("_cover_" in name for name in added)
    assert len(stressed) == 2 * len(task.stresses)  # every regime in both dtypes


@pytest.fixture(scope="module")
def static_grader(shared_verdicts):
    """The static stages as `estimate` grades them (v5e, seed 0, predictions on failures too),
    kept in the shared cache that `estimate --cache` reads below."""
    with Evaluator(backend="tpu-interpret", workers=1, generation="v5e", cache=shared_verdicts,
                   predict_failed=True) as ev:
        yield ev


def static_verdict(grader: Evaluator, task, split: str):
    return grader.grade(task, task.solution_source(), split, seed=0, through=LAST_STATIC_STAGE)


@pytest.mark.parametrize("task", PER_TASK)
def test_every_solution_passes_the_static_stages_on_each_split_alone(static_grader, task):
    """Rebench grades held-out alone and collect train alone, and 'all' hides what one split
    alone meets: it takes the least bench work share over both splits' check sizes (it hid
    attention_bwd's held-out false reject, whose padded check sizes did 137% of the reference's
    FLOPs) and train's check sizes bound its derived cases (held-out's own bound left topk's
    bench program uncovered, so unverified). Static stages only: nothing runs."""
    for split in ("train", "heldout"):
        verdict = static_verdict(static_grader, task, split)
        assert verdict.status == "pending", f"{split}: {verdict.message}"
        assert not verdict.details.get("coverage", {}).get("uncovered"), f"{split}: {verdict.details['coverage']}"


@pytest.mark.slow
def test_the_solutions_are_within_the_performance_bounds(static_grader):
    """The solutions are the repair targets and the baseline a model's kernel should beat: under
    the static model on v5e at the train bench sizes (worst dtype), at least 36 of them within
    2x of the ideal kernel and none above 3x (tasks/README.md, "Performance")."""
    worst = {}
    for task in SUITE:
        estimates = static_verdict(static_grader, task, "train").details["perf_model"]
        worst[task.name] = max(e["slowdown_vs_ideal"] for e in estimates.values())
    assert sum(s <= 2.0 for s in worst.values()) >= 36, worst
    assert max(worst.values()) <= 3.0, worst


@pytest.mark.slow
def test_the_performance_table_is_current(static_grader, shared_verdicts, cli):
    """tasks/README.md's performance table is what `python -m evaluator estimate --markdown`
    prints for the solutions as they are: regenerate it when a solution changes. Its v5e rows
    are read from the shared cache the static stages' tests fill (what they have not graded
    yet is graded here); its v6e rows are graded here."""
    text = (Path(tasks.__file__).parent / "README.md").read_text()
    section = text.split("\n## Performance", 1)[1].split("\n## ", 1)[0]
    committed = [line for line in section.splitlines() if line.startswith("|")]
    done = cli("estimate", "--markdown", "--cache", str(shared_verdicts))
    assert done.returncode == 0, done.stderr
    generated = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert committed == generated
