"""The command line and its exit codes: in-process through cli.main.main (capsys holds its
output), and one real `python -m evaluator` subprocess per subcommand for the entry point."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


SOLUTION = ROOT / "tasks" / "matmul" / "solution.py"


def cli_process(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m evaluator ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_tasks_json_lists_the_suite(cli):
    result = cli("tasks", "--json")
    assert result.returncode == 0, result.stderr
    listed = {t["name"]: t for t in json.loads(result.stdout)}
    assert {"matmul", "grouped_matmul", "attention_fwd_causal"} <= set(listed)
    assert listed["grouped_matmul"]["required_features"] == ["scalar_prefetch"]
    assert listed["matmul"]["cases"]["heldout/check"] > 0


def test_tasks_table_shows_signatures_unmangled():
    result = cli_process("tasks")  # the real entry point, for `tasks`
    assert result.returncode == 0
    assert "group_sizes[g]" in result.stdout  # rich markup must not eat [g]


def test_run_json_record_for_a_correct_kernel(cli):
    result = cli("run", "--task", "matmul", "--candidate", str(SOLUTION), "--json", "--seed", "7")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["status"] == "correct" and record["task"] == "matmul"
    assert record["backend"] == "tpu-interpret" and record["speedup"] is None
    assert record["details"]["base_seed"] == 7
    case = record["cases"][0]
    assert {"name", "dims", "dtype", "status", "max_abs_err", "rel_l2_err"} <= set(case)


def test_run_on_a_model_answer_with_a_failing_kernel_still_exits_zero(cli, tmp_path):
    answer = tmp_path / "answer.md"
    body = (ROOT / "tests" / "candidates" / "work_outside_dot.py").read_text()
    answer.write_text(f"Here is my kernel:\n```python\n{body}```\n")
    result = cli("run", "--task", "matmul", "--candidate", str(answer), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["status"] == "work_outside_kernel"


@pytest.mark.parametrize("args,needle,real", [
    # real=True: through a `python -m evaluator` subprocess (one per subcommand)
    (("run", "--task", "matmull", "--candidate", str(SOLUTION)), "did you mean matmul", True),
    (("run", "--task", "matmul", "--candidate", "no/such/file.py"), "not found", False),
    (("check-solutions", "--task", "nope"), "unknown task", True),
    (("tune", "--task", "matmul", "--candidate", "no/such/file.py"), "not found", True),
    (("estimate", "--candidate", str(SOLUTION)), "exactly one --task", True),
])
def test_usage_errors_exit_2_with_one_line(cli, args, needle, real):
    result = cli_process(*args) if real else cli(*args)
    assert result.returncode == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_check_solutions_for_one_task(cli):
    result = cli("check-solutions", "--task", "softmax", "--workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 solutions correct" in result.stdout


def test_estimate_table_for_a_candidate_on_two_generations(cli):
    result = cli("estimate", "--task", "matmul", "--candidate", str(SOLUTION), "--json", "--no-cache")
    assert result.returncode == 0, result.stderr
    row = {r["generation"]: r for r in map(json.loads, result.stdout.splitlines())}
    for gen in ("v5e", "v6e"):
        assert row[gen]["slowdown_vs_ideal"] >= 1.0 and row[gen]["hbm_mib"] >= row[gen]["ideal_mib"]
        assert row[gen]["predicted_speedup"] > 0 and row[gen]["static_stages"] == "passed"
    # v6e computes 4.7x faster but moves data only 2x faster: the same kernel is further off.
    assert row["v6e"]["slowdown_vs_ideal"] > row["v5e"]["slowdown_vs_ideal"]


def test_tune_refuses_a_candidate_that_fails_as_given(cli):
    wrong_task = ROOT / "tests" / "candidates" / "work_outside_zeros.py"  # a matmul for softmax
    result = cli("tune", "--task", "softmax", "--candidate", str(wrong_task))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("error: the candidate as given fails")
    assert "missing 1 required positional argument" in last


def test_tune_a_kernel_without_knobs_says_how_to_add_them(cli, tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("def kernel(x):\n    return x\n")
    result = cli("tune", "--task", "softmax", "--candidate", str(plain))
    assert result.returncode == 2 and "no block-size knobs" in result.stderr and "# tune" in result.stderr
