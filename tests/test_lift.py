"""An end-to-end lift on the CPU: Fixit training, then a 2-turn re-benchmark, base vs tuned.

A tiny model fine-tuned on one short task's repair rows must answer correctly within 2 turns, on
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


CONFIG = ROOT / "configs" / "lift-tiny.yaml"
# The recipe's model sees only the last 2 x (window - 1) + 1 = 15 tokens. So an explanation that
# quotes a run of code the repaired kernel also holds (`jnp.max(x, axis=-1, keepdims=True)`) lets it
# jump from the prose into the middle of the kernel and answer a truncated module: rows quoting more
# than this many characters of the kernel are left out. And a kernel in which the same 15 tokens
# come twice, followed by different tokens (an in_specs BlockSpec repeated as the out_specs), cannot
# be memorised: at the second copy the model goes on as after the first (softmax's solution lost
# its out_specs line that way).
MAX_SHARED_CHARS = 16
RECEPTIVE_TOKENS = 15
MAX_SOLUTION_TOKENS = 900  # leaves room for the explanation in the 1,024 answer tokens


def window_can_memorise(tokenizer, text: str) -> bool:
    """Whether every run of RECEPTIVE_TOKENS tokens of `text` is followed by one token only."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    following: dict[tuple[int, ...], int] = {}
    for i in range(len(ids) - RECEPTIVE_TOKENS):
        run = tuple(ids[i:i + RECEPTIVE_TOKENS])
        if following.setdefault(run, ids[i + RECEPTIVE_TOKENS]) != ids[i + RECEPTIVE_TOKENS]:
            return False
    return True


def lift_rows(tokenizer) -> tuple[str, list[str]]:
    """The task to teach and the ids of its rows: among the tasks whose solution is short and
    memorisable by the window, the shortest with train rows of the committed dataset whose repair
    is the solution (it passes the held-out shapes too) and whose explanation quotes little of it.
    Which tasks have such rows depends on the mutations a dataset rebuild drew."""
    import difflib

    import datasets
    from tasks import get_task

    rows = datasets.load_dataset(str(ROOT / "datasets" / "fixit-mutation"), split="train")
    found: dict[str, list[str]] = {}
    for row in rows:
        answer = row["messages"][-1]["content"]
        solution = get_task(row["task"]).solution_source()
        if extract_code(answer) != solution:
            continue
        explanation = answer.split("```")[0]
        shared = difflib.SequenceMatcher(None, explanation, solution, autojunk=False).find_longest_match()
        if shared.size <= MAX_SHARED_CHARS:
            found.setdefault(row["task"], []).append(row["id"])
    sizes = {task: len(tokenizer(get_task(task).solution_source())["input_ids"]) for task in found}
    usable = sorted((n, task) for task, n in sizes.items()
                    if n <= MAX_SOLUTION_TOKENS and window_can_memorise(tokenizer, get_task(task).solution_source()))
    assert usable, f"no task of the committed dataset has a usable row (tasks with rows: {sorted(found)})"
    return usable[0][1], found[usable[0][1]]


def build_base_model(out):
    """The recipe's tiny model, built as training.sft would build it (its tokenizer decides the
    task)."""
    import yaml

    from training.tiny_model import TinyModelArguments, dataset_texts

    config = yaml.safe_load(CONFIG.read_text())
    arguments = TinyModelArguments(build_tiny_model=True, **{k: v for k, v in config.items() if k.startswith("tiny_")})
    arguments.build_if_asked(str(out), lambda: dataset_texts(ROOT / config["dataset_path"]))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(out)


@pytest.mark.slow
def test_fixit_training_shows_a_lift_within_two_turns(tmp_path):
    from training.rebench import main as rebench
    from training.sft import main as sft

    base, tuned, out = tmp_path / "base", tmp_path / "tuned", tmp_path / "rebench"
    start = time.perf_counter()
    task, ids = lift_rows(build_base_model(base))
    assert sft(["--config", str(CONFIG), "--model_name_or_path", str(base),
                "--output_dir", str(tuned), "--dataset_ids", *ids]) == 0
    trained = time.perf_counter()
    assert rebench(["--model", f"base={base}", "--model", f"tuned={tuned}", "--task", task,
                    "--split", "train", "heldout", "--samples", "1", "--turns", "2", "--temperature", "0",
                    "--max-tokens", "1024", "--workers", "1", "--concurrency", "1", "--out", str(out)]) == 0
    done = time.perf_counter()
    results = json.loads((out / "report.json").read_text())["results"]
    success = {(model, split): [t["pass@1"] for t in results[model][split]["groups"]["train tasks"]["turns"]]
               for model in ("base", "tuned") for split in ("train", "heldout")}
    print(f"lift on {task}: pass@1 at turns 1, 2: {success}; training {trained - start:.0f} s, "
          f"rebench {done - trained:.0f} s")
    assert success[("base", "train")] == success[("base", "heldout")] == [0.0, 0.0]
    assert success[("tuned", "train")][-1] == success[("tuned", "heldout")][-1] == 1.0
