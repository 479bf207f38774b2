"""The verdict cache: hits come back marked, keys follow what decides a verdict, and several
processes can write one cache at once."""
import json
import multiprocessing

from cli.main import main as evaluator_main
from evaluator.cache import VerdictCache, cache_key
from evaluator.grader import Evaluator
from evaluator.record import Verdict
from tasks import get_task

SOLUTION = get_task("softmax").solution_source()


def test_a_second_grading_is_a_hit(tmp_path, evaluator):
    cached = Evaluator(pool=evaluator.pool, cache=tmp_path)   # the session's warm worker
    first = cached.grade("softmax", SOLUTION)
    second = cached.grade("softmax", f"Here you go:\n```python\n{SOLUTION}```\n")  # same code, other prose
    assert first.status == second.status == "correct"
    assert not first.cached and second.cached
    assert second.candidate_sha256 == first.candidate_sha256
    assert (cached.cache.hits, cached.cache.misses, len(cached.cache)) == (1, 1, 1)


def test_the_key_follows_code_seed_split_and_settings():
    task = get_task("softmax")
    base = {"split": "train", "seed": "fresh", "backend": "tpu-interpret", "through": None}
    key = cache_key(task, SOLUTION, base)
    assert cache_key(task, f"```python\n{SOLUTION}```", base) == key          # the extracted code decides
    assert cache_key(task, SOLUTION.replace("\n\n", "\n\n\n", 1), base) != key  # not normalised: lines move
    for change in ({"seed": 7}, {"split": "heldout"}, {"backend": "tpu-compile"}, {"through": "estimate"}):
        assert cache_key(task, SOLUTION, {**base, **change}) != key
    assert cache_key(get_task("log_softmax"), SOLUTION, base) != key


def test_estimate_reads_what_it_estimated_before(tmp_path, cli):
    """`estimate` grades through the static stages (status pending): a rerun on the same cache
    reads those verdicts back, as its --cache help says, instead of tracing every kernel again."""
    args = ("estimate", "--task", "softmax", "--tpu", "v5e", "--json", "--cache", str(tmp_path))
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert len(VerdictCache(tmp_path)) == 1
    second = cli(*args)
    assert second.stdout == first.stdout and json.loads(second.stdout)["static_stages"] == "passed"
    assert len(VerdictCache(tmp_path)) == 1


def test_infrastructure_verdicts_are_not_kept(tmp_path):
    cache = VerdictCache(tmp_path)
    crash = Verdict(task="softmax", task_version=1, status="runtime_error", message="worker died",
                    backend="tpu-interpret", split="train", stage="run", error_type="WorkerCrash")
    assert not cache.put("k", crash)
    assert cache.get("k") is None and len(cache) == 0


def _writer(folder: str, worker: int) -> None:
    cache = VerdictCache(folder)
    for i in range(40):
        v = Verdict(task="softmax", task_version=1, status="wrong_output", message=f"{worker}/{i}",
                    backend="tpu-interpret", split="train", stage="run")
        cache.put(f"{worker}-{i}", v)
        cache.put("shared", v)
        assert cache.get(f"{worker}-{i}").message == f"{worker}/{i}"


def test_several_processes_write_one_cache(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(VerdictCache(tmp_path)) == 4 * 40 + 1


def test_the_cli_says_cached(tmp_path, capsys):
    candidate = tmp_path / "k.py"
    candidate.write_text("I have no kernel yet.")
    args = ["run", "--task", "softmax", "--candidate", str(candidate), "--json", "--cache", str(tmp_path / "c")]
    assert evaluator_main(args) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is False
    assert evaluator_main(args) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True
