"""Grading on a real local Ray cluster: the same verdicts as local grading, nothing lost when an
actor dies, and a bounded number of tries for a candidate whose gradings keep dying."""
import dataclasses
import json
import threading
import time

import pytest

from evaluator.execution.sandbox import Limits
from evaluator.grader import Evaluator, Job
from tasks import get_task
from tests.conftest import PEER_FIXTURE, read_candidate, require_module

require_module("ray", "pip install -e '.[ray]'")

LIMITS = Limits(step_timeout_s=8)
# a mixed batch: correct, failing, hanging and crashing candidates, and one with no code
BATCH = [Job("softmax", get_task("softmax").solution_source()),
         Job("matmul", read_candidate("wrong_output_doubled")),
         Job("matmul", read_candidate("timeout_python_loop")),
         Job("softmax", read_candidate("runtime_error_data_race")),
         Job("matmul", read_candidate("runtime_error_memory_hog")),
         Job("softmax", "I would write a kernel here.")]
EXPECTED = ["correct", "wrong_output", "timeout", "runtime_error", "runtime_error", "extraction_error"]


def test_an_unreachable_cluster_is_a_one_line_error():
    with pytest.raises(ValueError, match="cannot reach the Ray cluster"):
        Evaluator(executor="ray", address="127.0.0.1:1", workers=1)   # nothing listens there
    with pytest.raises(ValueError, match="expected auto, local"):
        Evaluator(executor="ray", address="somewhere", workers=1)


@pytest.fixture(scope="module")
def cluster():
    import ray

    # 4 logical CPUs: the module's two actors, and the one a command-line run or a test of its own starts
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def on_ray(cluster):
    with Evaluator(executor="ray", workers=2, limits=LIMITS) as ev:
        yield ev


@pytest.mark.slow
def test_ray_gives_the_statuses_local_grading_gives(on_ray, quick_timeout_evaluator):
    remote = [v.status for v in on_ray.grade_many(BATCH)]
    local = [v.status for v in quick_timeout_evaluator.grade_many(BATCH)]
    assert remote == local == EXPECTED


@pytest.mark.slow
def test_an_actor_killed_mid_batch_loses_no_verdict(on_ray, cluster):
    jobs = [BATCH[0], BATCH[1], BATCH[0], BATCH[1]]
    before = on_ray.remote.replaced
    killer = threading.Timer(3.0, lambda: cluster.kill(on_ray.remote.actors[0]))
    killer.start()
    verdicts = on_ray.grade_many(jobs)
    killer.join()
    assert [v.status for v in verdicts] == ["correct", "wrong_output", "correct", "wrong_output"]
    assert on_ray.remote.replaced == before + 1


def test_a_candidate_whose_gradings_keep_dying_gets_a_runtime_error(cluster):
    from evaluator.execution.remote import RayExecutor

    with Evaluator(executor="ray", workers=1, limits=LIMITS) as ev:
        ev.remote.max_attempts = 2
        stop = threading.Event()

        def kill_whoever_grades():   # stands in for a kernel that takes its process down
            while not stop.is_set():
                time.sleep(2.0)
                for actor in list(ev.remote.actors):
                    cluster.kill(actor)

        thread = threading.Thread(target=kill_whoever_grades)
        thread.start()
        try:
            verdict = ev.grade("matmul", read_candidate("timeout_python_loop"))
        finally:
            stop.set()
            thread.join()
    assert isinstance(ev.remote, RayExecutor)
    assert verdict.status == "runtime_error" and verdict.details["actor_deaths"] == 2
    assert "killed the evaluator's process 2 times" in verdict.message


def test_a_replaced_task_reaches_an_actor_as_itself(on_ray):
    """Tasks travel pickled, not by name: a task whose reference was replaced is graded against
    that reference on the actor (the registry's softmax would call this solution correct)."""
    softmax = get_task("softmax")
    doubled = dataclasses.replace(softmax, version=77, reference=lambda x: 2 * softmax.reference(x))
    verdict = on_ray.grade(doubled, softmax.solution_source(), seed=0)
    assert (verdict.task_version, verdict.status) == (77, "wrong_output"), verdict.message


@pytest.mark.slow
def test_an_imported_task_grades_on_ray_from_the_command_line(on_ray, capsys):
    """--suite with --ray: the actor rebuilds the imported task from its suite (suites.open_task)."""
    from cli.main import main

    fixture = PEER_FIXTURE
    code = main(["run", "--task", "jaxbench/8p_GEMM", "--candidate", str(fixture / "benchmark" / "8p_GEMM" / "optimized.py"),
                 "--suite", f"jaxbench:{fixture}", "--ray", "auto", "--seed", "0", "--json"])
    verdict = json.loads(capsys.readouterr().out)
    assert code == 0 and verdict["status"] == "correct", verdict["message"]
