"""Every task's hand-written solution is correct on train and held-out cases."""
from evaluator.grader import Evaluator, Job
from tasks import all_tasks


def test_every_solution_is_correct_on_all_splits():
    suite = all_tasks()
    with Evaluator(backend="tpu-interpret", workers=2) as ev:
        ev.warm_up()
        verdicts = ev.grade_many([Job(t.name, t.solution_source(), "all") for t in suite])
    failed = [f"{t.name}: {v.message}" for t, v in zip(suite, verdicts) if v.status != "correct"]
    assert not failed, "\n".join(failed)
    for task, verdict in zip(suite, verdicts):
        assert {c.name for c in verdict.cases} == {c.name for c in task.select("all", "check")}
