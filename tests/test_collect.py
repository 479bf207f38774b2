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
from chat.prompts import machine_free
from data_gen.collect import main
from data_gen.failures.fingerprint import fingerprint
from data_gen.pool import DEFAULT_POOL, POOL_FILE, load_pool, pool_variants
from data_gen.rows.dataset import check_clean
from data_gen.rows.text_rules import row_violations
from data_gen.sources.grading import repair_key
from data_gen.sources.mutation import MutationSource
from tasks import get_task
from tests.conftest import ROOT

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
        assert machine_free(failing["message"]) in row["messages"][3]["content"]  # the verdict keeps seeds
        assert row_violations(row) == []
        check_clean(row)
    assert len({r["error_class"] for r in rows}) >= 3 and len({r["failure_kind"] for r in rows}) >= 5
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


def test_repairs_are_many_pool_kernels_each_behind_few_pairs(small_run):
    tmp, _ = small_run
    ds = datasets.load_dataset(str(tmp / "datasets" / "small"))
    rows = [r for split in ds.values() for r in split]
    per_repair = Counter((r["task"], fingerprint(r["repair_code"])) for r in rows)
    assert max(per_repair.values()) <= 3
    pool = {(e.task, e.fingerprint) for e in load_pool(DEFAULT_POOL) if e.ok}
    assert set(per_repair) <= pool  # every repair is a verified pool kernel
    for task in ("matmul", "softmax"):
        assert sum(t == task for t, _ in per_repair) >= 3
    card = (tmp / "datasets" / "small" / "README.md").read_text()
    assert f"| distinct repair kernels | {len(per_repair)} |" in card


@pytest.mark.slow
def test_a_stale_pool_entry_is_graded_again_before_use(tmp_path):
    """Fresh entries are trusted without grading; a stale one is graded once and journaled."""
    entries = [e for e in load_pool(DEFAULT_POOL) if e.task == "rms_norm" and e.ok][:2]
    assert len(entries) == 2
    entries[1].inputs_hash = "0" * 24
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / POOL_FILE).write_text("".join(e.to_json() + "\n" for e in entries))
    args = ["--task", "rms_norm", "--max-per-task", "4", "--workers", "1", "--pool", str(pool),
            "--name", "stale", "--out-dir", str(tmp_path / "datasets"), "--runs-dir", str(tmp_path / "runs")]
    assert main(args) == 0
    lines = [json.loads(line) for line in (tmp_path / "runs" / "stale" / "journal.jsonl").read_text().splitlines()]
    graded = [e for e in lines if e.get("kind") == "repair"]
    assert [e["key"] for e in graded] == [repair_key("rms_norm", entries[1].source)]
    assert {e["variant"] for e in lines if e.get("kind") == "attempt"} == {entries[0].name, entries[1].name}


def test_block_size_bugs_are_judged_by_the_static_stages(tmp_path, evaluator):
    """A block-size mutant fails at lowering / the VMEM budget or is dropped unrun; the dropped
    ones really pass when graded through every stage (the shortcut loses no failure)."""
    args = ["--task", "rms_norm", "--operator", "misaligned_block", "--operator", "vmem_overallocation",
            "--max-per-task", "6", "--workers", "1", "--name", "static",
            "--out-dir", str(tmp_path / "datasets"), "--runs-dir", str(tmp_path / "runs")]
    assert main(args) == 0
    attempts = journal_attempts(tmp_path / "runs" / "static" / "journal.jsonl")
    kept = [e for e in attempts if e["pair"]]
    dropped = [e for e in attempts if e["dropped"]]
    assert kept and dropped
    assert {e["status"] for e in kept} <= {"lowering_error", "compile_error"}
    assert {e["dropped"] for e in dropped} == {"survived: the static stages found no fault"}
    survivor = next(m for m in MutationSource([get_task("rms_norm")], 0, 0, variants=pool_variants(
        [e for e in load_pool() if e.task == "rms_norm"])).items() if m.id == dropped[0]["id"])
    assert evaluator.grade("rms_norm", survivor.answer(), "train", seed=0).status == "correct"


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


def test_a_journal_another_grader_wrote_is_not_resumed(small_run, tmp_path, capsys):
    """Its verdicts and this grader's would mix in one dataset."""
    tmp, args = small_run
    lines = (tmp / "runs" / "small" / "journal.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["settings"]["evaluator"] = "0" * 12  # what an older grader's digest looks like here
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "journal.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main([*args, "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "evaluator" in err and "--fresh" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,message", [
    (["--task", "geglu"], "held out"),
    (["--task", "matmull"], "matmul"),
    (["--source", "replay", "--replay", "/nonexistent.jsonl"], "not found"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, extra, message):
    assert main([*extra, "--runs-dir", str(tmp_path), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
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

    assert main(args[3:]) == 0  # the resume needs no fresh process: the same command, in this one
    attempts = journal_attempts(journal)
    ids = [e["id"] for e in attempts]
    assert len(ids) == len(set(ids)) == 14  # every item once: none lost, none graded twice
    assert done_before_kill <= set(ids)
    rows = [r for split in datasets.load_dataset(str(tmp_path / "datasets" / "killed")).values() for r in split]
    assert len(rows) == len({r["id"] for r in rows}) > 0


def test_each_task_gets_a_compound_bug(small_run):
    """Each task with a budget of 6 or more grades one compound (its pairs: test_dataset_rules)."""
    tmp, _ = small_run
    compound = [e for e in journal_attempts(tmp / "runs" / "small" / "journal.jsonl") if e["origin"] == "compound"]
    assert {e["task"] for e in compound} == {"matmul", "softmax"}
