"""check-suite --attempts (suites/attempts.py, suites/attempts_report.py): JAXBench's generated
kernels graded by us beside their own verdicts.

The fixture checkout (tests/peer_suites/jaxbench/pallas_eval) holds two models' answers in their
format, with their records: a correct softmax, a LeakyReLU with its branches swapped that their
all-zero weights let pass, a truncated answer, an answer our policy refuses whose run on their
side timed out, answers whose task is not in the checkout or does not load; a third model's softmax with two
bugs the repair search fixes (tests/test_real_failures.py).
"""
from __future__ import annotations

import json

import pytest

from suites.attempts import Journal, Ours, Theirs, classify, discover, task_name
from suites.attempts_report import cause, outcome
from tests.conftest import PEER_FIXTURE

FIXTURE = PEER_FIXTURE
SOFTMAX = "kernelbench-jax/level1/23_Softmax"
GEMM = "kernelbench-jax/level2/12_Gemm_Multiply_LeakyReLU"


# --- their records, classed -------------------------------------------------------------------
@pytest.mark.parametrize("record, verdict", [
    ({"status": "success", "correct": True, "correctness_reason": "ok"}, "correct"),
    ({"status": "success", "correct": False, "correctness_reason": "values differ"}, "failed"),
    ({"status": "error", "error": "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate "
      "6.00G. That was not possible. There are 1.25G free.; (0x0x0_HBM0)"}, "infrastructure"),
    ({"status": "error", "error": "RESOURCE_EXHAUSTED: Error loading program: Attempting to reserve 6.00G at "
      "the bottom of memory. That was not possible."}, "infrastructure"),
    ({"status": "error", "error": "Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: "
      "open(/dev/vfio/0): Device or resource busy"}, "infrastructure"),
    ({"status": "error", "error": "ERROR: Command timed out"}, "infrastructure"),
    # the program's own need, not their harness's: 80 GB of HBM at their sizes
    ({"status": "error", "error": "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
      "memory space hbm. Used 80.00G of 31.25G hbm."}, "failed"),
    ({"status": "error", "error": "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem"}, "failed"),
    ({"status": "error", "error": "invalid syntax (flash_attention_gemini3.py, line 1)"}, "failed"),
])
def test_their_verdicts_are_classed(record, verdict):
    assert classify(record).verdict == verdict


def test_an_empty_error_reads_the_traceback_and_a_lowering_failure_is_marked():
    theirs = classify({"status": "error", "error": "", "traceback": '  File "/x/jax/_src/pallas/mosaic/lowering.py", '
                       "line 2398, in _transpose_lowering_rule\n    raise NotImplementedError\nNotImplementedError\n"})
    assert theirs.verdict == "failed" and theirs.message == "NotImplementedError" and theirs.lowering
    cumsum = classify({"status": "error", "error": "Unimplemented primitive in Pallas TPU lowering for "
                       "KernelType.TC: cumsum. Please file an issue"})
    assert cumsum.lowering and not classify({"status": "error", "error": "name 'jnp' is not defined"}).lowering


def test_files_are_paired_as_their_harness_pairs_them_none_dropped():
    assert task_name("jaxkernelbench_level2", "12_Gemm") == "kernelbench-jax/level2/12_Gemm"
    assert task_name("priority_kernels", "gemm") == "jaxbench-priority/gemm"
    attempts = {a.key: a for a in discover(FIXTURE)}
    assert len(attempts) == 8
    assert attempts["alpha/jaxkernelbench_level1/23_Softmax.py"].task == SOFTMAX
    assert attempts["alpha/priority_kernels/gemm.py"].theirs is None  # no record: listed all the same
    assert attempts["alpha/jaxkernelbench_level1/19_ReLU.py"].theirs.verdict == "infrastructure"
    assert attempts["beta/jaxkernelbench_level2/12_Gemm_Multiply_LeakyReLU.py"].theirs.verdict == "infrastructure"
    assert [a.model for a in discover(FIXTURE, ["beta"])] == ["beta"] * 3


# --- causes -------------------------------------------------------------------------------------
CORRECT = Theirs("correct", "success", "ok", 0.0)
FAILED = Theirs("failed", "error", "name 'pl' is not defined")


@pytest.mark.parametrize("theirs, ours, starts", [
    (CORRECT, Ours("work_outside_kernel", "work_outside_kernel: the matmul runs outside the kernels\nmore"),
     "our work rule (work_outside_kernel): work_outside_kernel: the matmul runs outside the kernels"),
    (CORRECT, Ours("import_error", "import_error: AttributeError: module 'jax.experimental.pallas.tpu' has no "
                   "attribute 'repeat'", error_type="AttributeError"),
     "JAX version difference: jax.experimental.pallas.tpu.repeat is missing in our jax"),
    (CORRECT, Ours("wrong_output", "wrong_output: 98% of elements off", 1.3, repaired=["self.weight"]),
     "their all-zero inputs: our loader redrew self.weight"),
    (CORRECT, Ours("wrong_output", "wrong_output: 98% of elements off", 1.3), "false reject of ours? theirs: ok; ours: "),
    (CORRECT, Ours("timeout", "timeout: no result after 120 s while running case c."), "our grader's time limit"),
    (FAILED, Ours("correct", "correct: 2 cases"), "false accept of ours? theirs: name 'pl' is not defined"),
    (Theirs("failed", "error", "Unimplemented primitive in Pallas TPU lowering: cumsum", lowering=True),
     Ours("correct", "correct"), "JAX version difference (unconfirmed)"),
    (Theirs("failed", "error", "invalid syntax (gemm_gemini3.py, line 1)"), Ours("correct", "correct"),
     "their harness imports the file as is"),
    (Theirs("failed", "error", "invalid syntax (gemm_gemini3.py, line 1)"),
     Ours("extraction_error", "extraction_error: the answer ends inside a ```python block"), "truncated answer: "),
    (Theirs("infrastructure", "error", "ERROR: Command timed out", infrastructure="their ssh command timed out"),
     Ours("correct", "correct"), "their infrastructure failure: their ssh command timed out"),
    (FAILED, Ours("runtime_error", "runtime_error: boom"), ""),  # both failed, nothing to explain
])
def test_each_disagreement_gets_its_cause(theirs, ours, starts):
    said = cause(theirs, ours)
    assert said.startswith(starts) if starts else said == "", said


def test_outcomes():
    assert outcome(None, Ours("correct", "")) == "no_record"
    assert outcome(CORRECT, Ours("not_loaded", "no task")) == "not_loaded"
    assert outcome(CORRECT, Ours("correct", "")) == "both_correct"
    assert outcome(FAILED, Ours("wrong_output", "")) == "both_failed"


def test_the_journal_skips_a_torn_line_and_other_settings(tmp_path):
    path = tmp_path / "j.jsonl"
    Journal(path, {"seed": 0}).add("m/g/f.py", "abc", "t", Ours("correct", "correct", 0.01))
    Journal(path, {"seed": 1}).add("m/g/f.py", "abc", "t", Ours("wrong_output", "wrong"))
    with path.open("a") as f:
        f.write('{"key": "m/g/torn.py", "sha')
    assert Journal(path, {"seed": 0}).get("m/g/f.py", "abc") == Ours("correct", "correct", 0.01)
    assert Journal(path, {"seed": 1}).get("m/g/f.py", "abc").status == "wrong_output"
    assert Journal(path, {"seed": 0}).get("m/g/f.py", "other sha") is None


# --- the command, in process; a rerun grades nothing new ------------------------------------------
def _run(capsys, *args: str) -> tuple[int, str, str]:
    from cli.main import main

    code = main(["check-suite", f"jaxbench:{FIXTURE}", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_the_report_and_its_resumable_journal(tmp_path, capsys, monkeypatch):
    journal = tmp_path / "journal.jsonl"
    code, out, err = _run(capsys, "--attempts", "--journal", str(journal), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["generation"] == "v6e"
    assert report["summary"]["alpha"] == {"both_correct": 1, "both_failed": 0, "they_correct_we_failed": 1,
                                          "they_failed_we_correct": 0, "their_infrastructure": 0,
                                          "not_loaded": 2, "no_record": 0}
    assert report["summary"]["beta"] == {"both_correct": 0, "both_failed": 1, "they_correct_we_failed": 0,
                                         "they_failed_we_correct": 0, "their_infrastructure": 1,
                                         "not_loaded": 1, "no_record": 0}
    rows = {f"{r['model']}/{r['file']}": r for m in report["models"].values() for r in m}
    softmax = rows["alpha/23_Softmax.py"]
    assert softmax["ours"]["status"] == "correct", softmax["ours"]["message"]
    gemm = rows["alpha/12_Gemm_Multiply_LeakyReLU.py"]
    assert gemm["ours"]["status"] == "wrong_output" and gemm["ours"]["rel_l2"] > 0.1
    assert gemm["cause"].startswith("their all-zero inputs: our loader redrew self.bias, self.weight")
    assert rows["beta/23_Softmax.py"]["cause"].startswith("truncated answer: extraction_error")
    refused = rows["beta/12_Gemm_Multiply_LeakyReLU.py"]
    assert refused["ours"]["status"] == "policy_violation"
    assert refused["cause"].startswith("their infrastructure failure: their ssh command timed out")
    assert rows["beta/50_Conv2D_Weights_From_Torch.py"]["ours"]["message"].startswith("the task does not load")
    assert rows["alpha/gemm.py"]["ours"]["message"] == "no task: jaxbench-priority/gemm is not in the checkout"
    lines = journal.read_text().splitlines()
    assert len(lines) == 5  # the graded ones; what has no task or does not load is not journaled
    assert {json.loads(l)["key"] for l in lines} >= {"alpha/jaxkernelbench_level1/23_Softmax.py"}

    def no_grading(*args, **kwargs):
        raise AssertionError("a journaled attempt was graded again")

    monkeypatch.setattr("evaluator.grader.Evaluator.grade", no_grading)
    code, again, err = _run(capsys, "--attempts", "alpha", "beta", "--journal", str(journal), "--markdown",
                            "--task", SOFTMAX, "--task", GEMM)
    assert code == 0, err
    assert journal.read_text().splitlines() == lines
    assert "### alpha" in again and "| both correct | 1 |" in again and "| they correct, we failed | 1 |" in again
    assert "their all-zero inputs" in again and "truncated answer" in again
    assert "journal:" in err and "(4 of 4 attempts in it)" in err


def test_unknown_models_and_tasks_are_usage_errors(tmp_path, capsys):
    code, _, err = _run(capsys, "--attempts", "nobody", "--journal", str(tmp_path / "j.jsonl"))
    assert code == 2 and "nobody" in err and "alpha, beta, gamma" in err
    code, _, err = _run(capsys, "--attempts", "--task", "kernelbench-jax/level1/1_Nothing",
                        "--journal", str(tmp_path / "j.jsonl"))
    assert code == 2 and "no generated kernel answers kernelbench-jax/level1/1_Nothing" in err
