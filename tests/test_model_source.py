"""The `model` and `replay` sources end to end, against a local OpenAI-compatible server with canned kernels."""
import json
import time
from pathlib import Path

import pytest

import datasets
from data_gen.collect import main
from data_gen.dataset import heldout_markers
from data_gen.mutations import mutants
from tasks import all_tasks, get_task
from tests.conftest import read_candidate
from tests.fake_openai_server import FakeOpenAIServer


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def bug(task: str, op: str) -> str:
    return next(m.code for m in mutants(get_task(task)) if m.operator == op)


SOLUTION = {t: get_task(t).solution_source() for t in ("matmul", "softmax", "rms_norm", "layer_norm")}
EXPLAIN = "The accumulator was never zeroed at k == 0, so the sums started from garbage."


def respond(messages: list[dict], model: str) -> str:
    """Canned behaviour per task: wrong then repaired; right at once; repaired on the second turn;
    an answer with no code at all, then repaired."""
    task = messages[1]["content"].split("`")[1]
    attempt = next((m["content"] for m in messages if m["role"] == "assistant"), None)
    if task == "softmax":
        return fenced(SOLUTION["softmax"])
    if task == "matmul":
        return fenced(bug("matmul", "drop_accumulator_init")) if attempt is None else \
            f"{EXPLAIN}\n\n{fenced(SOLUTION['matmul'])}"
    if task == "rms_norm":
        if attempt is None:
            return fenced(bug("rms_norm", "hallucinated_import"))
        if "interpret=True" not in attempt:
            return "The import path was wrong; fixed it.\n\n" + fenced(bug("rms_norm", "interpret_flag"))
        return "interpret=True must go: the grader decides how kernels run.\n\n" + fenced(SOLUTION["rms_norm"])
    if task == "layer_norm":
        return "I would tile rows into VMEM." if attempt is None else \
            "The answer had no code block; here is the kernel.\n\n" + fenced(SOLUTION["layer_norm"])
    raise AssertionError(task)


def load_rows(folder: Path) -> list[dict]:
    return [r for split in datasets.load_dataset(str(folder)).values() for r in split]


def test_model_source_repair_loop(tmp_path):
    with FakeOpenAIServer(respond, models=("coder",)) as server:
        code = main(["--source", "model", "--base-url", server.base_url, "--model", "coder", "--max-turns", "2",
                     "--task", "matmul", "--task", "softmax", "--task", "rms_norm", "--task", "layer_norm",
                     "--workers", "1", "--concurrency", "4", "--out-dir", str(tmp_path), "--runs-dir",
                     str(tmp_path / "runs"), "--name", "m"])
        bodies = list(server.requests)
    assert code == 0
    assert len(bodies) == 2 + 1 + 3 + 2  # matmul: attempt + repair; softmax: 1; rms_norm: 1 + 2; layer_norm: 2
    rows = {r["task"]: r for r in load_rows(tmp_path / "m")}
    assert set(rows) == {"matmul", "rms_norm", "layer_norm"}
    assert rows["matmul"]["error_class"] == "wrong_output"
    assert rows["matmul"]["messages"][4]["content"].startswith(EXPLAIN)
    # the pair keeps the attempt the confirmed repair fixed: rms_norm's second, interpret=True one
    assert rows["rms_norm"]["error_class"] == "policy_violation"
    assert "interpret=True" in rows["rms_norm"]["messages"][2]["content"]
    assert rows["layer_norm"]["error_class"] == "extraction_error"
    assert all(r["source"] == "model" and r["origin"] == "coder" for r in rows.values())
    entries = [json.loads(x) for x in (tmp_path / "runs" / "m" / "journal.jsonl").read_text().splitlines()]
    by_task = {e["task"]: e for e in entries if e.get("kind") == "attempt"}
    assert by_task["softmax"]["dropped"] == "correct on the first try"
    assert [t["status"] for t in by_task["rms_norm"]["turns"]] == ["import_error", "policy_violation", "correct"]
    # nothing held out ever reached the model: no held-out shape, no held-out task
    for body in bodies:
        text = "\n".join(m["content"] for m in body["messages"])
        for task in rows:
            assert not any(marker in text for marker in heldout_markers(get_task(task)))
        assert not any(f"`{t.name}`" in text for t in all_tasks() if t.heldout_task)


def test_unreachable_endpoint_fails_fast_with_one_line(tmp_path, capsys):
    start = time.perf_counter()
    code = main(["--source", "model", "--base-url", "http://127.0.0.1:9/v1", "--model", "coder",
                 "--out-dir", str(tmp_path), "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot reach the model endpoint" in err and len(err.splitlines()) == 1
    assert time.perf_counter() - start < 15


def test_replay_source(tmp_path):
    replay = tmp_path / "attempts.jsonl"
    rows = [
        {"task": "matmul", "attempt": fenced(bug("matmul", "drop_accumulator_init")),
         "repair": fenced(SOLUTION["matmul"]), "explanation": EXPLAIN, "model": "old-run"},
        {"task": "softmax", "attempt": fenced(SOLUTION["softmax"])},
        {"task": "rms_norm", "attempt": fenced(bug("rms_norm", "interpret_flag"))},
        # a kernel the grader cannot run yet: no failure is confirmed, so no pair
        {"task": "softmax", "attempt": fenced(read_candidate("grader_limit_custom_linear_solve")),
         "repair": fenced(SOLUTION["softmax"]), "explanation": "Called the kernel directly."},
    ]
    replay.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["--source", "replay", "--replay", str(replay), "--workers", "1", "--out-dir", str(tmp_path),
                 "--runs-dir", str(tmp_path / "runs"), "--name", "r", "--validation-fraction", "0"])
    assert code == 0
    kept = load_rows(tmp_path / "r")
    assert [(r["task"], r["origin"], r["error_class"]) for r in kept] == [("matmul", "old-run", "wrong_output")]
    dropped = sorted(json.loads(x).get("dropped") or "" for x in
                     (tmp_path / "runs" / "r" / "journal.jsonl").read_text().splitlines())
    assert "attempt is correct" in dropped and "no repair: the row has none and no --teacher was given" in dropped
    assert any(reason.startswith("grader_limit: ") for reason in dropped)


@pytest.mark.parametrize("line", ['{"task": "matmul"}', "not json", '{"task": "nope", "attempt": "x"}'])
def test_bad_replay_rows_are_one_clear_line(tmp_path, capsys, line):
    replay = tmp_path / "bad.jsonl"
    replay.write_text(line + "\n")
    assert main(["--source", "replay", "--replay", str(replay), "--out-dir", str(tmp_path),
                 "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("bad.jsonl:1" in err or "nope" in err)
