"""Re-benchmark and generalization end to end, against a local server with canned answers."""
import json
from itertools import count
from threading import Lock

import pytest

from tasks import get_task
from tests.fake_openai_server import FakeOpenAIServer
from training.generalization import main as generalization_main
from training.metrics import fast_p, pass_at_k
from training.rebench import ModelSpec, main

SOLUTION = {t: get_task(t).solution_source() for t in ("matmul", "softmax")}
ZEROS = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

def _zeros(x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)

def kernel(x, *rest):
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    out = pl.pallas_call(_zeros, grid=(pl.cdiv(x2.shape[0], 8),),
                         in_specs=[pl.BlockSpec((8, d), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((8, d), lambda i: (i, 0)),
                         out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype))(x2)
    return out.reshape(x.shape)
"""
# correct on the train shapes (rows a multiple of 128), wrong on ragged held-out ones
TRAIN_ONLY_SOFTMAX = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

def _softmax(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)

def kernel(x):
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    rows = x2.shape[0]
    out = pl.pallas_call(_softmax, grid=(rows // 128,),
                         in_specs=[pl.BlockSpec((128, d), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((128, d), lambda i: (i, 0)),
                         out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype))(x2)
    return out.reshape(x.shape)
"""


def fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```"


def make_respond():
    """'good' answers matmul right every time and softmax right every other time; 'bad' never."""
    counters, lock = {}, Lock()

    def respond(messages, model):
        task = messages[1]["content"].split("`")[1]
        with lock:
            i = next(counters.setdefault((model, task), count()))
        if model == "bad":
            return "I think this works." if i % 2 else fenced(ZEROS)
        if task == "matmul":
            return fenced(SOLUTION["matmul"])
        return fenced(SOLUTION["softmax"] if i % 2 == 0 else ZEROS)
    return respond


def test_pass_at_k_matches_the_unbiased_estimator():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)   # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 3) == pytest.approx(1 - (7 * 6 * 5) / (10 * 9 * 8))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_fast_p_is_none_without_timings():
    assert fast_p(["correct", "wrong_output"], [None, None], 1.0) is None
    assert fast_p(["correct", "correct", "wrong_output"], [1.5, 0.8, 3.0], 1.0) == pytest.approx(1 / 3)


def test_model_specs_parse():
    assert ModelSpec.parse("tuned=qwen@http://h:8000/v1") == ModelSpec("tuned", "qwen", "http://h:8000/v1")
    assert ModelSpec.parse("t=runs/m+runs/adapter") == ModelSpec("t", "runs/m", adapter="runs/adapter")
    with pytest.raises(ValueError):
        ModelSpec.parse("no-label")


@pytest.mark.slow
def test_rebench_two_models_side_by_side(tmp_path, shared_verdicts):
    """The canned answers repeat, so the run's verdict cache grades each distinct one once: the
    report is what is under test here, not the grading."""
    with FakeOpenAIServer(make_respond(), models=("good", "bad")) as server:
        code = main(["--model", f"tuned=good@{server.base_url}", "--model", f"base=bad@{server.base_url}",
                     "--task", "matmul", "--task", "softmax", "--samples", "4", "--k", "1", "2",
                     "--workers", "2", "--out", str(tmp_path), "--cache", str(shared_verdicts)])
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["format"] == "pallas-kernel-gym/rebench-report" and report["settings"]["turns"] == 1
    tuned, base = report["results"]["tuned"]["train"], report["results"]["base"]["train"]
    matmul, softmax = tuned["tasks"]["matmul"]["turns"][0], tuned["tasks"]["softmax"]["turns"][0]
    assert matmul["pass@1"] == 1.0
    assert softmax["correct"] == 2
    assert softmax["pass@1"] == pytest.approx(0.5)
    assert softmax["pass@2"] == pytest.approx(5 / 6)
    assert tuned["groups"]["all"]["turns"][0]["pass@2"] == pytest.approx((1 + 5 / 6) / 2)
    assert tuned["levels"]["1"]["turns"][0]["pass@1"] == pytest.approx(0.75)
    assert softmax["fast_1"] is None  # no hardware, no timing
    assert base["groups"]["all"]["turns"][0]["pass@1"] == 0.0
    # zeros: no arithmetic in the kernel at the bench sizes; half the answers have no code
    assert base["groups"]["all"]["turns"][0]["statuses"] == {"extraction_error": 0.5, "work_outside_kernel": 0.5}
    table = (tmp_path / "report.md").read_text()
    assert "| softmax | 1 | train tasks | 50.0% | 0.0% |" in table
    assert (tmp_path / "turns.png").stat().st_size > 1000

    # kernel level: the tuned model's train-correct kernels, re-graded on held-out shapes
    out = tmp_path / "generalization.json"
    assert generalization_main(["--samples", str(tmp_path / "samples.jsonl"), "--out", str(out)]) == 0
    regraded = json.loads(out.read_text())["tuned"]
    assert regraded["matmul"] == {**regraded["matmul"], "kernels": 4, "still_pass": 1.0}
    assert regraded["softmax"]["kernels"] == 2 and regraded["softmax"]["still_pass"] == 1.0


def test_kernel_that_only_fits_train_shapes_fails_held_out(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"model": "m", "task": "softmax", "split": "train", "status": "correct",
                                   "answer": fenced(TRAIN_ONLY_SOFTMAX)}) + "\n")
    out = tmp_path / "g.json"
    assert generalization_main(["--samples", str(samples), "--out", str(out), "--workers", "1"]) == 0
    row = json.loads(out.read_text())["m"]["softmax"]
    assert row["still_pass"] == 0.0 and row["failures"]


def test_heldout_split_prompts_show_heldout_shapes_and_include_heldout_tasks(tmp_path):
    seen = []

    def respond(messages, model):
        seen.append(messages[1]["content"])
        return fenced(ZEROS)

    with FakeOpenAIServer(respond, models=("m",)) as server:
        assert main(["--model", f"m=m@{server.base_url}", "--split", "heldout", "--task", "softmax",
                     "--task", "geglu", "--samples", "1", "--workers", "1", "--out", str(tmp_path)]) == 0
    from chat.prompts import describe_case
    softmax = get_task("softmax")
    prompt = next(p for p in seen if "`softmax`" in p)
    assert all(describe_case(softmax, c) in prompt for c in softmax.select("heldout"))
    groups = {t: r["group"] for t, r in json.loads((tmp_path / "report.json").read_text())
              ["results"]["m"]["heldout"]["tasks"].items()}
    assert groups == {"softmax": "train tasks", "geglu": "held-out tasks"}


def test_two_turns_feed_back_the_fixit_feedback_and_count_repairs(tmp_path):
    """Turn 1 gets the task prompt, turn 2 exactly a Fixit row's four prompt messages: the same
    builder made them. A model that repairs from feedback succeeds within 2 turns, not in 1."""
    from chat.prompts import repair_messages, task_messages
    from evaluator.record import Verdict

    def respond(messages, model):
        task = messages[1]["content"].split("`")[1]
        if len(messages) == 2:   # first answer: no code at all, or a kernel that computes nothing
            return "I would tile it." if task == "matmul" else fenced(ZEROS)
        return fenced(SOLUTION[task])

    with FakeOpenAIServer(respond, models=("m",)) as server:
        assert main(["--model", f"m=m@{server.base_url}", "--task", "matmul", "--task", "softmax",
                     "--samples", "1", "--turns", "3", "--workers", "2", "--out", str(tmp_path)]) == 0
        requests = [r["messages"] for r in server.requests]
    results = json.loads((tmp_path / "report.json").read_text())["results"]["m"]["train"]
    for task in ("matmul", "softmax"):
        first, second, third = results["tasks"][task]["turns"]
        assert (first["pass@1"], second["pass@1"], third["pass@1"]) == (0.0, 1.0, 1.0)
        assert (first["asked"], second["asked"], third["asked"]) == (1, 1, 0)  # stops once correct
        assert second["statuses"] == third["statuses"] == {"correct": 1.0}
    assert results["tasks"]["matmul"]["turns"][0]["statuses"] == {"extraction_error": 1.0}
    assert len(requests) == 4  # two tasks, two answers each: nothing asked after a correct answer

    journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()[1:]]
    first = next(e for e in journal if e["conversation"] == "m|train|softmax|0" and e["turn"] == 1)
    head = task_messages(get_task("softmax"), "none", split="train", evaluation=True)
    expected = repair_messages(head, first["answer"], Verdict.from_dict(first["verdict"]))
    assert next(r for r in requests if len(r) == 4 and "`softmax`" in r[1]["content"]) == expected
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {s["task"]: [t["status"] for t in s["turns"]] for s in samples} == {
        "matmul": ["extraction_error", "correct"], "softmax": ["work_outside_kernel", "correct"]}


def test_a_killed_run_resumes_without_asking_again(tmp_path):
    """SIGKILL mid-run, then the same command: every graded answer is kept, none is asked again,
    and a changed setting is refused."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def respond(messages, model):
        time.sleep(0.2)
        return "still thinking"   # never code: every conversation runs all its turns

    out = tmp_path / "run"
    journal = out / "journal.jsonl"

    def answers() -> list[dict]:
        lines = journal.read_text().splitlines()[1:] if journal.exists() else []
        return [json.loads(line) for line in lines if line.endswith("}")]

    with FakeOpenAIServer(respond, models=("m",)) as server:
        args = ["--model", f"m=m@{server.base_url}", "--task", "matmul", "--task", "softmax",
                "--samples", "3", "--turns", "3", "--concurrency", "2", "--workers", "1", "--out", str(out)]
        proc = subprocess.Popen([sys.executable, "-m", "training.rebench", *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while len(answers()) < 5 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = {e["id"] for e in answers()}
        assert 5 <= len(before) < 18, "the run was not killed mid-way"
        asked_before = len(server.requests)

        assert main([*args[:-1], str(tmp_path / "elsewhere"), "--turns", "2"]) == 0  # other --out: a new run
        assert main([*args, "--turns", "2"]) == 2   # same --out, other turns: refused
        server.requests.clear()
        assert main(args) == 0
        def turn_of(request):
            return (request["messages"][1]["content"].split("`")[1], request["seed"], len(request["messages"]) // 2)
        rerun = [turn_of(r) for r in server.requests]
    ids = [e["id"] for e in answers()]
    assert len(ids) == len(set(ids)) == 18   # 2 tasks x 3 samples x 3 turns, each once
    asked_again = {f"m|train|{task}|{seed}|{turn}" for task, seed, turn in rerun} & before
    assert not asked_again
    assert len(rerun) <= 18 - len(before) + 2  # at most the answers in flight at the kill were lost
    assert asked_before >= len(before)
    results = json.loads((out / "report.json").read_text())["results"]["m"]["train"]
    assert all(r["turns"][2]["asked"] == 3 and r["turns"][2]["statuses"] == {"extraction_error": 1.0}
               for r in results["tasks"].values())
