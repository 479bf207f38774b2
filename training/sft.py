"""Fine-tune a causal LM on a Fixit dataset with TRL's SFTTrainer and PEFT LoRA.

    python -m training.sft --config fixit.yaml                     # the real recipe (GPUs)
    python -m training.sft --config configs/fixit-tiny.yaml        # offline smoke run on a CPU
    python -m training.sft --config configs/lift-tiny.yaml         # CPU lift check: memorise one repair
    python -m training.sft --config fixit.yaml --learning_rate 5e-5 --num_train_epochs 2
    accelerate launch --num_processes 8 -m training.sft --config fixit.yaml

Configuration is TRL's own: `TrlParser` over our script arguments, `SFTConfig` and `ModelConfig`.
The YAML gives defaults and the command line overrides them; an unknown key is an error, and so,
in one line, is what the config needs that this machine lacks (training/preflight.py). Each
Fixit row becomes a prompt (system, task, failing kernel, feedback) and a completion (the
explanation and the fix), so the loss covers only the last assistant message, end-of-turn
token included, and the model learns to stop. `dataset_tasks` and `dataset_ids` keep only some
rows (e.g. the rows that share one repair kernel); by default every row of the split is used.
`dataset_mix` adds more Fixit datasets (a real-failure dataset beside the mutation one):

    python -m training.sft --config configs/fixit-tiny.yaml --dataset_mix datasets/fixit-jaxbench:0.3
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.preflight import EntryPoint, ModelNotAvailable, parse_checked, require_model  # noqa: F401 (re-exported)
from training.tiny_model import TinyModelArguments


@dataclass
class FixitScriptArguments(TinyModelArguments):
    dataset_path: str = field(default="datasets/fixit-mutation", metadata={
        "help": "Fixit dataset folder written by `python -m data_gen.collect` (parquet + card)"})
    dataset_train_split: str = field(default="train", metadata={"help": "split to train on"})
    dataset_test_split: str = field(default="validation", metadata={
        "help": "split to evaluate on (its tasks are unseen in train); used when eval_strategy is not 'no'"})
    dataset_tasks: list[str] | None = field(default=None, metadata={
        "help": "train (and evaluate) only on the rows of these tasks; default: every row"})
    dataset_ids: list[str] | None = field(default=None, metadata={
        "help": "train (and evaluate) only on the rows with these `id`s, e.g. rows sharing one repair "
                "kernel; default: every row"})
    dataset_mix: list[str] | None = field(default=None, metadata={
        "help": "more Fixit dataset folders to train on with dataset_path, each PATH or PATH:WEIGHT (e.g. "
                "datasets/fixit-jaxbench:0.3). Without weights the splits are concatenated, each row once. "
                "With a weight, each row is drawn from a dataset chosen with probability proportional to its "
                "weight (dataset_path's is dataset_weight) until every dataset has been seen whole, so a "
                "small dataset with a large weight is repeated (datasets.interleave_datasets)"})
    dataset_weight: float = field(default=1.0, metadata={
        "help": "dataset_path's weight when dataset_mix gives weights"})
    merge_adapter: bool = field(default=False, metadata={
        "help": "also save the base model with the LoRA adapter merged in, under <output_dir>/merged"})


class BadDatasetMix(ValueError):
    """A dataset_mix entry with a weight that is not a positive number."""


class NoTrainingRows(RuntimeError):
    """dataset_tasks / dataset_ids left no row to train on."""


def to_prompt_completion(row: dict[str, Any]) -> dict[str, Any]:
    """The first four messages are the prompt; the repair (explanation + kernel) is the completion."""
    messages = row["messages"]
    if len(messages) != 5 or messages[-1]["role"] != "assistant":
        raise ValueError(f"row {row.get('id')}: expected the five Fixit messages ending with the repair")
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def load_fixit(path: str, splits: list[str], *, tasks: list[str] | None = None,
               ids: list[str] | None = None):
    """The dataset's splits as prompt/completion datasets (missing splits are None), keeping only
    the rows of `tasks` and with `ids` when those are given."""
    import datasets

    if not Path(path).is_dir():
        raise FileNotFoundError(f"dataset folder {path} not found: build it with `python -m data_gen.collect`")
    ds = datasets.load_dataset(path)
    out = []
    for split in splits:
        if split not in ds:
            out.append(None)
            continue
        rows = ds[split]
        if tasks is not None:
            rows = rows.filter(lambda row: row["task"] in set(tasks))
        if ids is not None:
            rows = rows.filter(lambda row: row["id"] in set(ids))
        out.append(rows.map(to_prompt_completion, remove_columns=rows.column_names))
    return out


def mix_entries(script_args: FixitScriptArguments) -> list[tuple[str, float | None]]:
    """(folder, weight) for dataset_path and each dataset_mix entry; weights are None when no
    entry gives one (concatenation)."""
    entries: list[tuple[str, float | None]] = []
    for spec in script_args.dataset_mix or []:
        path, sep, weight = spec.rpartition(":")
        try:
            entries.append((path, float(weight)) if sep and path else (spec, None))
        except ValueError:
            entries.append((spec, None))
    if all(w is None for _, w in entries):
        return [(script_args.dataset_path, None)] + entries
    bad = [p for p, w in entries if w is not None and w <= 0]
    if bad or script_args.dataset_weight <= 0:
        raise BadDatasetMix(f"dataset weights must be positive: {', '.join(bad) or script_args.dataset_path}")
    return [(script_args.dataset_path, script_args.dataset_weight)] + [(p, 1.0 if w is None else w)
                                                                        for p, w in entries]


def load_mixture(script_args: FixitScriptArguments, seed: int = 0):
    """The train and evaluation sets over dataset_path and dataset_mix (see dataset_mix's help);
    evaluation concatenates every dataset's test split."""
    import datasets

    entries = mix_entries(script_args)
    splits = [script_args.dataset_train_split, script_args.dataset_test_split]
    loaded = [(path, weight, *load_fixit(path, splits, tasks=script_args.dataset_tasks, ids=script_args.dataset_ids))
              for path, weight in entries]
    missing = [path for path, _, train, _ in loaded if train is None]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} has no split {script_args.dataset_train_split!r}")
    trains = [train for _, _, train, _ in loaded if len(train)]
    evaluations = [e for _, _, _, e in loaded if e is not None and len(e)]
    evaluation = datasets.concatenate_datasets(evaluations) if evaluations else None
    if len(trains) < 2:
        return (trains[0] if trains else loaded[0][2]), evaluation
    if entries[0][1] is None:
        return datasets.concatenate_datasets(trains), evaluation
    weights = [w for _, w, train, _ in loaded if len(train)]
    return datasets.interleave_datasets(trains, probabilities=[w / sum(weights) for w in weights], seed=seed,
                                        stopping_strategy="all_exhausted"), evaluation


def dataset_folders(values: Any) -> list[tuple[str, str]]:
    """(config key, folder) of every Fixit dataset a run reads: the preflight checks they exist."""
    return [("dataset_path" if i == 0 else "dataset_mix", path) for i, (path, _) in enumerate(mix_entries(values))]


# The machine check's view of this entry point; its CPU check of a recipe takes one step, aside.
ENTRY = EntryPoint("training.sft", "configs/fixit-tiny.yaml", folders=dataset_folders,
                   small_run=lambda values: ["--max_steps", "1", "--eval_strategy", "no",
                                             "--output_dir", "runs/sft-cpu-check"])


def make_parser():
    from trl import ModelConfig, SFTConfig, TrlParser

    return TrlParser((FixitScriptArguments, SFTConfig, ModelConfig), prog="python -m training.sft")


def build_trainer(script_args: FixitScriptArguments, training_args: Any, model_args: Any):
    """The SFTTrainer for these arguments (model checked and, for smoke runs, built first)."""
    from transformers import AutoTokenizer
    from trl import SFTTrainer, get_peft_config

    from training.tiny_model import dataset_texts

    name = model_args.model_name_or_path
    if not name:
        raise ModelNotAvailable("no model: set model_name_or_path in the config or on the command line")
    script_args.build_if_asked(name, lambda: [t for path, _ in mix_entries(script_args) for t in dataset_texts(path)])
    require_model(name)
    train, evaluation = load_mixture(script_args, training_args.seed)
    if len(train) == 0:
        raise NoTrainingRows(f"no row of split {script_args.dataset_train_split!r} in {script_args.dataset_path} "
                             "matches dataset_tasks / dataset_ids")
    training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}),
                                       "dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation}
    tokenizer = AutoTokenizer.from_pretrained(name, revision=model_args.model_revision)
    return SFTTrainer(model=name, args=training_args, train_dataset=train,
                      eval_dataset=evaluation if training_args.eval_strategy != "no" else None,
                      processing_class=tokenizer, peft_config=get_peft_config(model_args))


def write_summary(trainer: Any, output_dir: Path) -> dict[str, Any]:
    """training_summary.json and loss_curve.png from the trainer's log history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = trainer.state.log_history
    train = [(h["step"], h["loss"]) for h in history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    summary = {"steps": trainer.state.global_step, "train_loss": train, "eval_loss": evals,
               "final": next((h for h in reversed(history) if "train_runtime" in h), {})}
    (output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train:
        ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (last assistant message)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(output_dir / "loss_curve.png", dpi=110)
    plt.close(fig)
    return summary


def train(script_args: FixitScriptArguments, training_args: Any, model_args: Any) -> dict[str, Any]:
    trainer = build_trainer(script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    output_dir = Path(training_args.output_dir)
    trainer.save_model(str(output_dir))  # the LoRA adapter when PEFT is on, else the full model
    summary = write_summary(trainer, output_dir) if trainer.is_world_process_zero() else {}
    if script_args.merge_adapter and trainer.is_world_process_zero():
        merged = trainer.model.merge_and_unload() if hasattr(trainer.model, "merge_and_unload") else trainer.model
        merged.save_pretrained(output_dir / "merged")
        trainer.processing_class.save_pretrained(output_dir / "merged")
    return summary


def main(argv: list[str] | None = None) -> int:
    import yaml

    try:  # a bad config (unknown key, invalid value, missing file) is the user's to fix: one line
        script_args, training_args, model_args = parse_checked(make_parser(), argv, ENTRY)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        return fail(exc)
    try:
        summary = train(script_args, training_args, model_args)
    except (ModelNotAvailable, NoTrainingRows, BadDatasetMix, FileNotFoundError) as exc:
        return fail(exc)
    final = summary.get("train_loss", [])[-1:] or [("-", "-")]
    print(f"saved to {training_args.output_dir} (steps {summary.get('steps')}, last train loss {final[0][1]})")
    return 0


def fail(exc: BaseException) -> int:
    """A bad config or input: one line on stderr, exit 2."""
    print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
