"""Dataset building: dedupe, balance, split by task, and a folder that always loads what was written."""
from collections import Counter

import datasets
from data_gen.rows.dataset import balance, dedupe, round_robin, validation_tasks, write_dataset


def row(task: str, error_class: str, origin: str, code: str, level: int = 1) -> dict:
    return {"id": f"{task}-{origin}-{code}", "task": task, "level": level, "case_split": "train",
            "error_class": error_class,
            "failure_kind": {"lowering_error": "block_alignment", "wrong_output": "wrong_values"}.get(error_class, ""),
            "origin": origin, "source": "mutation", "context": "none", "failing_code": code,
            "repair_code": "def kernel(x):\n    return x\n",
            "messages": [{"role": "user", "content": f"task {task}"}, {"role": "assistant", "content": code}]}


def test_round_robin_takes_one_from_each_queue_in_turn():
    assert round_robin([[1, 2, 3], [4], [5, 6]], 4) == [1, 4, 5, 2]
    assert round_robin([[1, 2], [3]], 0) == [1, 3, 2]


def test_dedupe_ignores_comments_and_layout():
    a = row("matmul", "wrong_output", "op", "x = 1  # one")
    b = row("matmul", "wrong_output", "op", "x  =  1")
    assert dedupe([a, b]) == [a]


def test_balance_caps_each_cell_and_keeps_its_variety():
    rows = [row("matmul", "lowering_error", "a", f"x = {i}") for i in range(5)]
    rows += [row("matmul", "lowering_error", "b", "y = 1"), row("matmul", "wrong_output", "a", "z = 1")]
    kept = balance(rows, 2)
    assert Counter((r["error_class"], r["origin"]) for r in kept) == {
        ("lowering_error", "a"): 1, ("lowering_error", "b"): 1, ("wrong_output", "a"): 1}


def test_validation_tasks_are_whole_tasks_and_never_all():
    tasks = [f"t{i}" for i in range(10)]
    chosen = validation_tasks(tasks, 0.2)
    assert len(chosen) == 2 and chosen == validation_tasks(list(reversed(tasks)), 0.2)
    assert validation_tasks(["only"], 0.5) == set()


def test_a_rewritten_folder_loads_the_new_rows(tmp_path):
    """`datasets` once returned the previous run's rows: its cache was keyed on file patterns."""
    for n, folder in ((2, tmp_path / "one" / "fixit"), (3, tmp_path / "two" / "fixit")):
        rows = [row("matmul", "wrong_output", "op", f"x = {i}") for i in range(n)]
        write_dataset(rows, folder, "fixit", validation_fraction=0, description="test")
        assert len(datasets.load_dataset(str(folder))["train"]) == n


def test_the_card_counts_pairs_per_level_and_per_task(tmp_path):
    rows = [row("matmul", "wrong_output", "op", f"x = {i}") for i in range(3)]
    rows += [row("softmax", "wrong_output", "op", "y = 1"), row("paged_attention", "wrong_output", "op", "z = 1", 3)]
    write_dataset(rows, tmp_path / "fixit", "fixit", validation_fraction=0, description="test")
    tasks = (tmp_path / "fixit" / "README.md").read_text().split("\n## Tasks\n", 1)[1]
    assert "| 1 | 2 | 4 |" in tasks and "| 3 | 1 | 1 |" in tasks  # level, tasks, pairs
    assert "| matmul | 1 | 3 |" in tasks and "| paged_attention | 3 | 1 |" in tasks
