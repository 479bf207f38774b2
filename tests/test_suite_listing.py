"""`tasks --suite`: entries listed at once, without running their code; what building them found
comes from the load cache (suites/listing.py), which every build fills."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from cli.main import main
from suites import listing, open_suite
from suites.listing import CACHE_ENV, LoadRecord, cache_dir, lookup, store
from tests.conftest import PEER_FIXTURE, ROOT, SUITE_CACHE_ENV

FIXTURE = PEER_FIXTURE
GEMM = "jaxbench/8p_GEMM"
RMSNORM = "jaxbench/12p_RMSNorm"
LOADABLE = [GEMM, RMSNORM, "jaxbench/19k_Matmul_Subtract_Multiply_ReLU", "kernelbench-jax/level1/23_Softmax",
            "kernelbench-jax/level2/12_Gemm_Multiply_LeakyReLU"]
NOT_LOADABLE = ["jaxbench/11p_Static_Group_Size", "kernelbench-jax/level1/50_Conv2D_Weights_From_Torch"]


def _tasks(capsys, root: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["tasks", "--suite", f"jaxbench:{root}", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _listed(capsys, root: Path, *extra: str) -> dict[str, dict]:
    code, out, err = _tasks(capsys, root, "--json", *extra)
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)}


@pytest.fixture
def no_worker(monkeypatch):
    """A listing must not run their code: starting a sandbox worker fails the test."""
    from evaluator.execution.sandbox import Worker

    def refuse(self):
        raise AssertionError("a listing started a sandbox worker")

    monkeypatch.setattr(Worker, "start", refuse)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A copy of the fixture checkout, `tasks --suite --load` run once on it into its own cache."""
    base = tmp_path_factory.mktemp("listing")
    root, cache = base / "jaxbench", base / "cache"
    shutil.copytree(FIXTURE, root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(cache))
        code = main(["tasks", "--suite", f"jaxbench:{root}", "--load", "--json"])
    assert code == 0
    return root, cache


def _copy(loaded, tmp_path: Path, monkeypatch) -> Path:
    """The loaded checkout and its cache, copied so that a test may edit them."""
    root, cache = loaded
    shutil.copytree(root, tmp_path / "jaxbench")
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "jaxbench"


def test_the_tests_never_write_the_users_cache():
    assert SUITE_CACHE_ENV == CACHE_ENV
    assert not str(cache_dir()).startswith(str(Path.home() / ".cache"))


def test_cache_folder_follows_xdg_and_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "pallas-kernel-gym" / "suite-loads"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"


def test_a_listing_without_cache_names_every_entry_and_runs_nothing(tmp_path, monkeypatch, capsys, no_worker):
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    rows = _listed(capsys, FIXTURE)
    assert sorted(rows) == sorted([*LOADABLE, *NOT_LOADABLE])
    assert {r["status"] for r in rows.values()} == {"not yet loaded"}
    assert all(r["signature"] is None and r["cases"] is None for r in rows.values())
    gemm = rows[GEMM]
    assert (gemm["kind"], gemm["level"], gemm["file"], gemm["optimized"]) == (
        "workload", 3, "benchmark/8p_GEMM/baseline.py", True)
    softmax = rows["kernelbench-jax/level1/23_Softmax"]
    assert (softmax["kind"], softmax["level"], softmax["file"], softmax["optimized"]) == (
        "model", 1, "jaxkernelbench/level1/23_Softmax.py", False)
    code, out, err = _tasks(capsys, FIXTURE, "--markdown")
    assert code == 0 and all(f"| `{name}` |" in out for name in rows) and "not yet loaded" in out
    assert "7 of 7 entries not yet loaded" in err and "--load" in err
    code, out, err = _tasks(capsys, FIXTURE)  # the table
    assert code == 0 and GEMM in out and "not yet loaded" in out and "--load" in err
    assert not cache.exists() or not any(cache.iterdir())


def test_load_fills_the_cache_and_a_listing_reads_it(loaded, capsys, monkeypatch, no_worker):
    root, cache = loaded
    monkeypatch.setenv(CACHE_ENV, str(cache))
    assert len(list(cache.glob("*.json"))) == 7 and not list(cache.glob(".tmp-*"))
    rows = _listed(capsys, root)
    assert sorted(n for n, r in rows.items() if r["status"] == "loaded") == sorted(LOADABLE)
    assert "Python int" in rows["jaxbench/11p_Static_Group_Size"]["why_not"]
    assert rows[NOT_LOADABLE[1]]["status"] == "not loaded"
    gemm = rows[GEMM]
    assert gemm["signature"] == "workload(A[2048, 2048] bfloat16, B[2048, 2048] bfloat16) -> [2048, 2048] bfloat16"
    assert gemm["cases"] == {"train/check": 1, "train/bench": 1, "heldout/check": 1, "heldout/bench": 0}
    assert gemm["check_sizes"] == {"M": 2048, "K": 2048, "N": 2048} and gemm["cap"] == 2048
    assert any(dims == gemm["bench_sizes"] for dims in gemm["case_sizes"].values())
    assert rows["jaxbench/19k_Matmul_Subtract_Multiply_ReLU"]["repaired"] == ["bias", "weight"]
    code, out, err = _tasks(capsys, root, "--markdown")
    assert code == 0 and f"| `{rows[GEMM]['signature']}` |" in out and "not yet loaded" not in out + err
    code, out, err = _tasks(capsys, root)  # the table
    assert code == 0 and "loaded" in out and "not yet loaded" not in out + err


def test_a_record_holds_a_suite_row_less_its_gradings(loaded, monkeypatch):
    from suites.report import SuiteRow

    root, cache = loaded
    with open_suite(f"jaxbench:{root}") as suite:
        record = lookup(suite.entry(RMSNORM), cache)
    row = SuiteRow(**record.row_fields())
    assert row.loaded and row.check_sizes and row.bench_sizes and row.heldout and not row.baseline


def test_editing_a_file_invalidates_only_its_entry(loaded, tmp_path, monkeypatch, capsys, no_worker):
    root = _copy(loaded, tmp_path, monkeypatch)
    baseline = root / "benchmark/12p_RMSNorm/baseline.py"
    baseline.write_text(baseline.read_text() + "\n# edited\n")
    rows = _listed(capsys, root)
    assert rows[RMSNORM]["status"] == "not yet loaded"
    assert all(r["status"] != "not yet loaded" for n, r in rows.items() if n != RMSNORM)


def test_load_builds_only_what_the_cache_lacks(loaded, tmp_path, monkeypatch, capsys):
    root = _copy(loaded, tmp_path, monkeypatch)
    baseline = root / "benchmark/12p_RMSNorm/baseline.py"
    baseline.write_text(baseline.read_text() + "\n# edited\n")
    code, out, err = _tasks(capsys, root, "--load", "--json")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert len(lines) == 7 and sum(line.endswith("(cached)") for line in lines) == 6
    assert any(f"loaded: {RMSNORM} (" in line and not line.endswith("(cached)") for line in lines)
    assert "not loaded: jaxbench/11p_Static_Group_Size: " in err
    assert len(list((tmp_path / "cache").glob("*.json"))) == 8
    assert json.loads(out)[1]["status"] == "loaded"


def test_building_a_task_fills_the_cache(tmp_path, monkeypatch):
    """run --task, check-suite, check-solutions all build through Suite.task."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with open_suite(f"jaxbench:{FIXTURE}") as suite:
        task = suite.task("kernelbench-jax/level1/23_Softmax")
        record = lookup(suite.entry(task.name))
    assert record is not None and record.loaded and record.signature == task.signature
    assert record.summary == task.summary() and set(record.cases) == {c.name for c in task.cases}


def test_the_adapters_code_is_in_the_key_and_nothing_else(tmp_path, monkeypatch):
    """Code of the adapter (what ADAPTER_ROOTS import, tasks/spec.py with them) changes the key; a
    comment, the report's code or the attempts' does not (evaluator/digest.py)."""
    from evaluator import digest

    for path in [*(ROOT / "suites").glob("*.py"), *(ROOT / "tasks").glob("*.py")]:
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    monkeypatch.setattr(digest, "ROOT", tmp_path)
    digests = []
    for edit, text in (("", ""), ("suites/sizes.py", "EDITED = 1\n"), ("tasks/spec.py", "EDITED = 1\n"),
                       ("suites/jaxbench.py", "# a comment\n"), ("suites/attempts.py", "EDITED = 1\n")):
        if edit:
            with open(tmp_path / edit, "a") as f:
                f.write(text)
        digest.code_digest.cache_clear()
        listing.adapter_digest.cache_clear()
        digests.append(listing.adapter_digest())
    digest.code_digest.cache_clear()
    listing.adapter_digest.cache_clear()
    assert len(set(digests[:3])) == 3 and digests[2] == digests[3] == digests[4]


def test_writes_are_atomic_and_thread_safe(tmp_path):
    with open_suite(f"jaxbench:{FIXTURE}") as suite:
        entry = suite.entry(GEMM)
    records = [LoadRecord(GEMM, False, why_not=f"reason {i} " + "x" * 20000) for i in range(8)]
    threads = [threading.Thread(target=store, args=(entry, r, tmp_path)) for r in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in tmp_path.iterdir()] == [f"{listing.entry_key(entry)}.json"]
    assert lookup(entry, tmp_path) in records


def test_an_unwritable_cache_is_said_not_fatal(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with open_suite(f"jaxbench:{FIXTURE}") as suite:
        entry = suite.entry(GEMM)
    assert store(entry, LoadRecord(GEMM, True), blocker) is False
    assert "suite load cache not written" in capsys.readouterr().err
    assert lookup(entry, blocker) is None


def test_load_needs_a_suite(capsys):
    assert main(["tasks", "--load"]) == 2
    assert "--load needs --suite" in capsys.readouterr().err
