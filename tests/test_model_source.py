"""The `model` and `replay` sources end to end, against a local OpenAI-compatible server with canned kernels."""
import json
import time
from pathlib import Path

import pytest

import datasets
from data_gen.collect import main
from data_gen.failures.mutations import mutants
from data_gen.rows.dataset import heldout_markers
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


@pytest.mark.slow
def test_replay_source(tmp_path):
    replay = tmp_path / "attempts.jsonl"
    cut = SOLUTION["softmax"][: SOLUTION["softmax"].index("pl.pallas_call(") + len("pl.pallas_call(")]
    rows = [
        {"task": "matmul", "attempt": fenced(bug("matmul", "drop_accumulator_init")),
         "repair": fenced(SOLUTION["matmul"]), "explanation": EXPLAIN, "model": "old-run"},
        {"task": "softmax", "attempt": fenced(SOLUTION["softmax"])},
        # no repair given: the search repairs it with the interpret_flag repairer
        {"task": "rms_norm", "attempt": fenced(bug("rms_norm", "interpret_flag")), "model": "old-run"},
        # cut off mid-code: not searched, and without a teacher not repaired
        {"task": "softmax", "attempt": f"Here it is.\n```python\n{cut}"},
        # a wrong value the catalogue's repairers have no edit for
        {"task": "matmul", "attempt": fenced(bug("matmul", "drop_accumulator_init"))},
        # a kernel the grader cannot run yet: no failure is confirmed, so no pair
        {"task": "softmax", "attempt": fenced(read_candidate("grader_limit_custom_linear_solve")),
         "repair": fenced(SOLUTION["softmax"]), "explanation": "Called the kernel directly."},
    ]
    replay.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["--source", "replay", "--replay", str(replay), "--workers", "1", "--out-dir", str(tmp_path),
                 "--runs-dir", str(tmp_path / "runs"), "--name", "r", "--validation-fraction", "0"])
    assert code == 0
    kept = {r["task"]: r for r in load_rows(tmp_path / "r")}
    assert {t: (r["origin"], r["error_class"], r["repaired_by"]) for t, r in kept.items()} == {
        "matmul": ("old-run", "wrong_output", "given"),
        "rms_norm": ("old-run", "policy_violation", "search: interpret_flag")}
    searched = kept["rms_norm"]["messages"][-1]["content"]
    assert searched.startswith("One fix makes the kernel correct:\n1. `interpret=True` left in the pallas_call.")
    assert "interpret=True" not in kept["rms_norm"]["repair_code"]
    entries = [json.loads(x) for x in (tmp_path / "runs" / "r" / "journal.jsonl").read_text().splitlines()]
    dropped = sorted(e.get("drop_reason") or "" for e in entries if e.get("kind") == "attempt")
    assert dropped == ["", "", "attempt is correct", "grader_limit", "not repaired", "truncated"]
    card = (tmp_path / "r" / "README.md").read_text()
    assert "| wrong_values | 2 | 0 | 1 | 1 |" in card and "| prose_in_code | 1 | 1 | 0 | 0 |" in card
    assert "| search: interpret_flag | 1 |" in card


@pytest.mark.slow
def test_a_rebench_journal_replays_into_pairs_with_a_teacher(tmp_path):
    """Models' own failing turns (training.rebench --turns 2: a tiny local model that answers
    garbage, and a served one) become pairs: the search repairs what it can, a teacher the
    rest, over several turns of our feedback."""
    from training.rebench import main as rebench
    from training.tiny_model import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", ["Write a Pallas kernel. ```python\ndef kernel(x): return x\n```"] * 50,
                            vocab_size=300, hidden=32, layers=1)

    def served(messages: list[dict], name: str) -> str:
        task = messages[1]["content"].split("`")[1]
        if name == "student":
            return fenced(bug("softmax", "interpret_flag")) if task == "softmax" else "I would tile it."
        if task == "softmax":
            return "The rows need a max subtracted first.\n\n" + fenced(SOLUTION["softmax"])
        # matmul: wrong at the teacher's first turn, right at its second (shown its own failed repair)
        if messages[2]["content"].startswith("The kernel needs the accumulator."):
            return "It has to zero the accumulator first.\n\n" + fenced(SOLUTION["matmul"])
        return "The kernel needs the accumulator.\n\n" + fenced(bug("matmul", "drop_accumulator_init"))

    with FakeOpenAIServer(served, models=("student", "teacher")) as server:
        assert rebench(["--model", f"student=student@{server.base_url}", "--model", f"tiny={tiny}",
                        "--task", "softmax", "--task", "matmul", "--samples", "1", "--turns", "2",
                        "--max-tokens", "16", "--workers", "1", "--out", str(tmp_path / "rb")]) == 0
        code = main(["--source", "replay", "--replay", str(tmp_path / "rb" / "journal.jsonl"), "--teacher", "teacher",
                     "--teacher-base-url", server.base_url, "--max-turns", "2", "--workers", "1",
                     "--out-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs"), "--name", "j",
                     "--validation-fraction", "0"])
    assert code == 0
    rows = load_rows(tmp_path / "j")
    made = {(r["task"], r["origin"], r["repaired_by"]) for r in rows}
    assert ("softmax", "student", "search: interpret_flag") in made
    assert ("softmax", "tiny", "model: teacher") in made
    # every matmul failure ends in the same teacher repair of the same failed repair: one row after dedupe
    matmul = [r for r in rows if r["task"] == "matmul"]
    assert len(matmul) == 1 and matmul[0]["repaired_by"] == "model: teacher"
    # the pair keeps the attempt the confirmed repair answered: the teacher's own first, failed, repair
    assert matmul[0]["messages"][2]["content"].startswith("The kernel needs the accumulator.")
    assert matmul[0]["error_class"] == "wrong_output"
    assert matmul[0]["messages"][4]["content"].startswith("It has to zero the accumulator first.")
    entries = [json.loads(x) for x in (tmp_path / "runs" / "j" / "journal.jsonl").read_text().splitlines()]
    turns = [[t["status"] for t in e["turns"]] for e in entries if e.get("task") == "matmul" and e.get("turns")]
    assert turns and all(t == ["wrong_output", "correct"] for t in turns)


@pytest.mark.parametrize("line", ['{"task": "matmul"}', "not json", '{"task": "nope", "attempt": "x"}'])
def test_bad_replay_rows_are_one_clear_line(tmp_path, capsys, line):
    replay = tmp_path / "bad.jsonl"
    replay.write_text(line + "\n")
    assert main(["--source", "replay", "--replay", str(replay), "--out-dir", str(tmp_path),
                 "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("bad.jsonl:1" in err or "nope" in err)
