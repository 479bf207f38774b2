"""Many correct kernels per task: fingerprints, candidates, and the committed verified pool."""
import ast
import json

import pytest

from data_gen.failures.fingerprint import canonical, fingerprint
from data_gen.failures.variants import candidates, strip_comments
from data_gen.pool import DEFAULT_POOL, POOL_FILE, build, inputs_hash, load_pool, main, stale_entries
from evaluator.digest import task_files
from evaluator.execution.backends import default_backend
from evaluator.truth.stress import stress_cases
from tasks import all_tasks, get_task

TRAIN_TASKS = [t for t in all_tasks() if not t.heldout_task]
MATMUL = get_task("matmul").solution_source()


# --- fingerprints -------------------------------------------------------------------------------

def test_cosmetic_changes_keep_the_fingerprint():
    renamed = (MATMUL.replace("acc_ref", "accumulator").replace("matmul_kernel", "mm_body")
               .replace("bm", "tile_m"))
    recommented = strip_comments(MATMUL).replace('"""Tiled matmul', '"""A tiled matmul')
    reflowed = MATMUL.replace("    return _matmul(x, y, bm=_block(m, BLOCK_M, 8), bn=",
                              "    return _matmul(\n        x, y, bm=_block(m, BLOCK_M, 8), bn=")
    assert len({fingerprint(s) for s in (MATMUL, renamed, recommented, reflowed)}) == 1
    assert renamed != MATMUL and reflowed != MATMUL


def test_other_numbers_or_structure_change_the_fingerprint():
    assert fingerprint(MATMUL.replace("BLOCK_K = 1024", "BLOCK_K = 512")) != fingerprint(MATMUL)
    assert fingerprint(MATMUL.replace('"arbitrary"', '"parallel"')) != fingerprint(MATMUL)
    assert fingerprint(MATMUL.replace("jnp.zeros_like", "jnp.ones_like")) != fingerprint(MATMUL)


def test_canonical_form_is_valid_python_without_docstrings():
    text = canonical(MATMUL)
    ast.parse(text)
    assert "Tiled matmul" not in text and "acc_ref" not in text and "jnp.dot" not in text


# --- candidates ---------------------------------------------------------------------------------

def test_strip_comments_keeps_the_code():
    stripped = strip_comments(MATMUL)
    assert "#" not in stripped
    assert ast.dump(ast.parse(stripped)) == ast.dump(ast.parse(MATMUL))


@pytest.mark.parametrize("task", TRAIN_TASKS, ids=lambda t: t.name)
def test_every_train_task_has_distinct_candidates(task):
    cands = candidates(task, 6)
    assert cands[0].name == "solution" and cands[0].source == task.solution_source()
    assert len(cands) >= 3
    assert len({fingerprint(c.source) for c in cands}) == len(cands)
    for cand in cands[1:]:
        ast.parse(cand.source)
        if cand.origin == "rewrite":
            assert cand.recipe["knobs"]  # a rewrite changes at least one block size


# --- the committed pool -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    return load_pool(DEFAULT_POOL)


def test_the_committed_pool_is_fresh(pool):
    """Every entry's hash matches the code as committed: rebuild the pool (python -m data_gen.pool)
    after changing the evaluator, a task or a variant, or the default run re-grades it."""
    stale = stale_entries(pool, default_backend())
    assert not stale, f"{len(stale)} stale entries, e.g. {stale[0].task} {stale[0].name}"


def test_the_pool_holds_many_distinct_correct_kernels(pool):
    kept = [e for e in pool if e.ok]
    assert len({(e.task, e.fingerprint) for e in kept}) >= 150
    by_task = {t.name: [e for e in kept if e.task == t.name] for t in TRAIN_TASKS}
    assert all(len(entries) >= 3 for entries in by_task.values()), \
        {t: len(es) for t, es in by_task.items() if len(es) < 3}
    assert sum(e.origin == "alternative" for e in kept) >= 10
    for entry in kept:
        assert fingerprint(entry.source) == entry.fingerprint
        assert entry.verdict["status"] == "correct" and entry.verdict["split"] == "train"
        assert {c["status"] for c in entry.verdict["cases"]} == {"correct"}
        task = get_task(entry.task)
        own = {c.name for c in task.select("train", "check")}
        stressed = {c.name for c, _ in stress_cases(task, "train")}  # the task's input regimes
        added = {a["case"] for a in entry.verdict["details"]["coverage"]["added"]}  # coverage cases
        assert {c["name"] for c in entry.verdict["cases"]} == own | stressed | added


def test_the_hash_covers_source_task_files_and_evaluator():
    task = get_task("softmax")
    files = {p.name for p in task_files(task)}
    assert {"task.py", "spec.py"} <= files
    assert "task.py" in {p.name for p in task_files(get_task("attention_bwd_causal"))} and \
        any(p.parent.name == "attention_bwd" for p in task_files(get_task("attention_bwd_causal")))
    base = inputs_hash(task, "x = 1\n", "tpu-interpret")
    assert inputs_hash(task, "x = 2\n", "tpu-interpret") != base
    assert inputs_hash(task, "x = 1\n", "tpu") != base
    assert inputs_hash(get_task("rms_norm"), "x = 1\n", "tpu-interpret") != base


@pytest.mark.slow
def test_build_grades_only_new_and_stale_entries(tmp_path):
    """A second build grades nothing; an entry whose hash is stale is graded again, alone."""
    from rich.console import Console

    task = get_task("rms_norm")
    console = Console(quiet=True)
    entries, graded = build([task], tmp_path, per_task=2, workers=1, console=console)
    assert graded == 2 and sum(e.ok for e in entries) == 2
    _, graded = build([task], tmp_path, per_task=2, workers=1, console=console)
    assert graded == 0
    lines = (tmp_path / POOL_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    first["inputs_hash"] = "0" * 24
    (tmp_path / POOL_FILE).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert main(["--task", "rms_norm", "--pool", str(tmp_path), "--check"]) == 1
    _, graded = build([task], tmp_path, per_task=2, workers=1, console=console)
    assert graded == 1
    assert main(["--task", "rms_norm", "--pool", str(tmp_path), "--check"]) == 0
    assert "| rms_norm | 2 | 2 |" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--task", "geglu"], "held-out"),
    (["--task", "softmaxx"], "softmax"),
])
def test_bad_input_is_one_clear_line(argv, message, capsys, tmp_path):
    assert main([*argv, "--pool", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
