"""Every task's hand-written solution is correct on train and held-out cases."""
from evaluator.grader import Job
from tasks import all_tasks


def test_every_solution_is_correct_on_all_splits(evaluator):
    suite = all_tasks()
    verdicts = evaluator.grade_many([Job(t.name, t.solution_source(), "all") for t in suite])
    for task, verdict in zip(suite, verdicts):
        assert verdict.status == "correct", f"{task.name}: {verdict.message}"
        ran = {c.name for c in verdict.cases}
        assert ran == {c.name for c in task.select("all", "check")}
