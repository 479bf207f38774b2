"""An end-to-end lift on the CPU: Fixit training, then a 2-turn re-benchmark, base vs tuned.

A tiny model fine-tuned on the log_softmax repair rows must answer correctly within 2 turns, on
the train cases and on the held-out shapes, while the untrained model fails both turns. This
proves the wiring (one chat template and one message builder for training and benchmarking,
code extraction, grading, reporting), not that a tiny model learned Pallas: the recipe
(configs/lift-tiny.yaml) makes it memorise one kernel.
"""
import json
import time

import pytest

from evaluator.candidate.extract import extract_code
from tests.conftest import ROOT, require_module

for _module in ("torch", "transformers", "trl"):
    require_module(_module, "pip install -e '.[train]'")


# The recipe's model sees only the last ~15 tokens, so an explanation that quotes a run of code the
# repaired kernel also holds (`jnp.max(x, axis=-1, keepdims=True)`) lets it jump from the prose
# into the middle of the kernel and answer a truncated module. Rows quoting more than this many
# characters of the kernel are left out.
MAX_SHARED_CHARS = 16


def rows_repaired_by_the_solution(task: str) -> list[str]:
    """Ids of the committed dataset's rows of `task` whose repair is the task's own solution (it
    passes the held-out shapes too) and whose explanation quotes little of it, so the tuned model
    has one kernel to learn and cannot lose its place in it."""
    import difflib

    import datasets
    from tasks import get_task

    solution = get_task(task).solution_source()
    rows = datasets.load_dataset(str(ROOT / "datasets" / "fixit-mutation"), split="train")
    ids = []
    for row in rows:
        answer = row["messages"][-1]["content"]
        if row["task"] != task or extract_code(answer) != solution:
            continue
        explanation = answer.split("```")[0]
        shared = difflib.SequenceMatcher(None, explanation, solution, autojunk=False).find_longest_match()
        if shared.size <= MAX_SHARED_CHARS:
            ids.append(row["id"])
    return ids


@pytest.mark.slow
def test_fixit_training_shows_a_lift_within_two_turns(tmp_path):
    from training.rebench import main as rebench
    from training.sft import main as sft

    ids = rows_repaired_by_the_solution("log_softmax")
    assert ids, "the committed dataset has no log_softmax row repaired by the solution"
    base, tuned, out = tmp_path / "base", tmp_path / "tuned", tmp_path / "rebench"
    start = time.perf_counter()
    assert sft(["--config", str(ROOT / "configs" / "lift-tiny.yaml"), "--model_name_or_path", str(base),
                "--output_dir", str(tuned), "--dataset_ids", *ids]) == 0
    trained = time.perf_counter()
    assert rebench(["--model", f"base={base}", "--model", f"tuned={tuned}", "--task", "log_softmax",
                    "--split", "train", "heldout", "--samples", "1", "--turns", "2", "--temperature", "0",
                    "--max-tokens", "1024", "--workers", "1", "--concurrency", "1", "--out", str(out)]) == 0
    done = time.perf_counter()
    results = json.loads((out / "report.json").read_text())["results"]
    success = {(model, split): [t["pass@1"] for t in results[model][split]["groups"]["train tasks"]["turns"]]
               for model in ("base", "tuned") for split in ("train", "heldout")}
    print(f"lift: pass@1 at turns 1, 2: {success}; training {trained - start:.0f} s, "
          f"rebench {done - trained:.0f} s")
    assert success[("base", "train")] == success[("base", "heldout")] == [0.0, 0.0]
    assert success[("tuned", "train")][-1] == success[("tuned", "heldout")][-1] == 1.0
