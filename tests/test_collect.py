"""`python -m data_gen.collect` end to end: a dataset that loads, a journal that resumes, clear errors."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import datasets
from data_gen.collect import main
from data_gen.dataset import check_clean

ROOT = Path(__file__).parent.parent
SMALL = ["--task", "matmul", "--task", "softmax", "--max-per-task", "7", "--workers", "1"]


def journal_attempts(path: Path) -> list[dict]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e.get("kind") == "attempt"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collect")
    args = [*SMALL, "--name", "small", "--out-dir", str(tmp / "datasets"), "--runs-dir", str(tmp / "runs")]
    assert main(args) == 0
    return tmp, args


def test_dataset_loads_with_five_verified_messages(small_run):
    tmp, _ = small_run
    ds = datasets.load_dataset(str(tmp / "datasets" / "small"))
    rows = [r for split in ds.values() for r in split]
    assert len(rows) >= 8
    assert set(ds) == {"train", "validation"}
    assert {r["task"] for r in ds["train"]}.isdisjoint({r["task"] for r in ds["validation"]})
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "user", "assistant"]
        failing, repaired = json.loads(row["failing_verdict"]), json.loads(row["repair_verdict"])
        assert failing["status"] == row["error_class"] != "correct"
        assert repaired["status"] == "correct" and repaired["split"] == failing["split"] == "train"
        assert row["repair_code"].strip() in row["messages"][4]["content"]
        assert failing["message"] in row["messages"][3]["content"]
        check_clean(row)
    assert len({r["error_class"] for r in rows}) >= 4
    assert len({r["id"] for r in rows}) == len(rows)


def test_card_states_the_counts_and_figure_exists(small_run):
    tmp, _ = small_run
    folder = tmp / "datasets" / "small"
    card = (folder / "README.md").read_text()
    ds = datasets.load_dataset(str(folder))
    counts = Counter(r["error_class"] for split in ds.values() for r in split)
    for error_class, n in counts.items():
        assert f"| {error_class} | {n} |" in card
    assert (folder / "error_classes.png").stat().st_size > 1000


def test_rerun_resumes_without_regrading_or_duplicates(small_run, capsys):
    tmp, args = small_run
    journal = tmp / "runs" / "small" / "journal.jsonl"
    before = journal_attempts(journal)
    start = time.perf_counter()
    assert main(args) == 0
    assert time.perf_counter() - start < 30  # nothing left to grade
    after = journal_attempts(journal)
    assert len(after) == len(before)
    assert f"{len(before)} already in" in " ".join(capsys.readouterr().err.split())


def test_other_settings_on_the_same_journal_are_refused(small_run, capsys):
    tmp, args = small_run
    assert main([*args, "--context", "spec"]) == 2
    err = capsys.readouterr().err
    assert "context" in err and "--fresh" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,message", [
    (["--task", "geglu"], "held out"),
    (["--task", "matmull"], "matmul"),
    (["--source", "replay", "--replay", "/nonexistent.jsonl"], "not found"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, extra, message):
    assert main([*extra, "--runs-dir", str(tmp_path), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_killed_run_resumes_with_nothing_lost_or_repeated(tmp_path):
    args = [sys.executable, "-m", "data_gen.collect", *SMALL, "--name", "killed",
            "--out-dir", str(tmp_path / "datasets"), "--runs-dir", str(tmp_path / "runs")]
    journal = tmp_path / "runs" / "killed" / "journal.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and (not journal.exists() or len(journal_attempts(journal)) < 4):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run, workers included
    proc.wait()
    done_before_kill = {e["id"] for e in journal_attempts(journal)}
    assert 4 <= len(done_before_kill) < 14

    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    attempts = journal_attempts(journal)
    ids = [e["id"] for e in attempts]
    assert len(ids) == len(set(ids)) == 14  # every item once: none lost, none graded twice
    assert done_before_kill <= set(ids)
    rows = [r for split in datasets.load_dataset(str(tmp_path / "datasets" / "killed")).values() for r in split]
    assert len(rows) == len({r["id"] for r in rows}) > 0
