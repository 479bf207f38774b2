"""Reinforcement learning on the grader: TRL's GRPOTrainer, PEFT LoRA, rewards from the evaluator.

    python -m training.rl --config configs/grpo-tiny.yaml          # offline smoke run on a CPU
    python -m training.rl --config configs/grpo.yaml               # the recipe (GPU, vLLM, Ray grading)
    python -m training.rl --config configs/grpo.yaml --resume_from_checkpoint true

Configuration is TRL's own: `TrlParser` over our `RLScriptArguments`, `GRPOConfig` and
`ModelConfig`, YAML defaults overridden by flags, unknown keys refused, what the machine lacks
(a GPU, the weights) named in one line first (training/preflight.py). Each training prompt is
an episode of training/environment.py's KernelEnv: the model answers the task, the evaluator
grades the answer, a failing answer's feedback is appended and the model answers again, up to
`max_turns` answers. The whole conversation is one GRPO completion whose feedback tokens are
masked out of the loss (TRL's `env_mask`); its reward is the discounted return of its answers
(training/reward.py). Every rollout batch is one row of `rl_log.jsonl` (reward, correct rate,
hack rate, mean predicted speedup, statuses); at the end come `reward_curve.png`, the adapter,
`rl_summary.json`, and a re-benchmark of the base and tuned models on held-out shapes and tasks
(`lift.md`).
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from training.environment import KernelEnv
from training.reward import RewardSpec, is_hack, speedup_of
from training.preflight import EntryPoint, ModelNotAvailable, parse_checked, require_model
from training.tiny_model import TinyModelArguments

LOG_NAME = "rl_log.jsonl"


@dataclass
class RLScriptArguments(TinyModelArguments):
    tasks: list[str] | None = field(default=None, metadata={
        "help": "tasks to train on (default: every train task of ours)"})
    split: str = field(default="train", metadata={"help": "the cases episodes are graded on: train or heldout"})
    prompts_per_task: int = field(default=8, metadata={
        "help": "rows of the prompt dataset per task (each row becomes num_generations episodes)"})
    max_turns: int = field(default=2, metadata={
        "help": "answers per episode at most: after a failing answer the model reads the feedback and answers again"})
    gamma: float = field(default=0.4, metadata={"help": "discount per turn of an episode's return (Kevin-32B: 0.4)"})
    speed_weight: float = field(default=0.25, metadata={
        "help": "a correct kernel's reward moves by this much per doubling of its speedup over XLA"})
    speed_cap: float = field(default=4.0, metadata={"help": "speedups beyond this factor (either way) count as it"})
    context: str = field(default="none", metadata={"help": "prompt context: none, spec or guide"})
    tpu: str | None = field(default=None, metadata={"help": "TPU generation (default v5e)"})
    grading_backend: str | None = field(default=None, metadata={
        "help": "evaluator backend (default: tpu on a TPU host, else tpu-interpret)"})
    grading_workers: int = field(default=2, metadata={"help": "evaluator worker processes (Ray actors with ray_address)"})
    ray_address: str | None = field(default=None, metadata={
        "help": "grade on a Ray cluster: auto, ray://HOST:10001, or local (a private one)"})
    verdict_cache: str | None = field(default="runs/rl-verdicts", metadata={
        "help": "verdict cache folder: an answer graded before is not graded again (null: no cache)"})
    rebench: bool = field(default=True, metadata={
        "help": "at the end, re-benchmark the base and the tuned model (training.rebench) and write lift.md"})
    rebench_tasks: list[str] | None = field(default=None, metadata={
        "help": "tasks of the final re-benchmark (default: the training tasks); held-out tasks among them are "
                "graded on the held-out split"})
    rebench_samples: int = field(default=4, metadata={"help": "conversations per task and split in the re-benchmark"})
    rebench_turns: int = field(default=2, metadata={"help": "answers per re-benchmark conversation at most"})
    rebench_max_tokens: int = field(default=4096, metadata={"help": "answer length of the re-benchmark"})


class ConfigError(ValueError):
    """A setting that cannot work (an unknown split, a reward that would pay for nothing)."""


def reward_spec(args: RLScriptArguments) -> RewardSpec:
    try:
        return RewardSpec(speed_weight=args.speed_weight, speed_cap=args.speed_cap, gamma=args.gamma)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def training_tasks(args: RLScriptArguments) -> list[Any]:
    """The tasks named (an unknown one raises tasks.UnknownTaskError), else our train tasks."""
    import tasks

    if args.split not in ("train", "heldout"):
        raise ConfigError(f"split must be train or heldout, got {args.split!r}")
    if not args.tasks:
        return [t for t in tasks.all_tasks() if not t.heldout_task]
    chosen = [tasks.get_task(name) for name in args.tasks]
    held_out = [t.name for t in chosen if t.heldout_task]
    if held_out:
        raise ConfigError(f"{', '.join(held_out)}: held-out tasks are for the re-benchmark (rebench_tasks), not training")
    return chosen


def prompt_dataset(tasks: list[Any], env: Any, per_task: int):
    """Conversational prompts, `per_task` rows of each task's first observation."""
    import datasets

    rows = [{"prompt": env.first_messages(task), "task": task.name} for task in tasks for _ in range(per_task)]
    return datasets.Dataset.from_list(rows)


class RolloutLog:
    """One JSON line per rollout batch; a resumed run drops the rows its checkpoint had not reached."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        kept = []
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] < resume_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in kept))

    def append(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class GraderRollout:
    """TRL's `rollout_func`: each prompt is played as an episode of KernelEnv, all episodes of a
    batch in lockstep (one generation call per turn, grading fanned out to the evaluator's
    workers). The completion is every answer with the feedback between them (env_mask 0)."""

    def __init__(self, evaluator: Any, tasks: list[Any], args: RLScriptArguments, log: RolloutLog):
        self.evaluator, self.args, self.log, self.spec = evaluator, args, log, reward_spec(args)
        self.console = Console(stderr=True)
        self.make_env = lambda: KernelEnv(evaluator, tasks, args.split, args.max_turns, self.spec, args.context)
        probe = self.make_env()
        # The trainer hands over prompts, not rows: each task is known by its first observation.
        self.task_by_prompt = {self.prompt_key(probe.first_messages(t)): t.name for t in tasks}

    @staticmethod
    def prompt_key(messages: list[dict[str, str]]) -> str:
        return json.dumps(messages, sort_keys=True)

    def __call__(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, Any]:
        from evaluator.grader import Job

        started = time.monotonic()
        tokenizer = trainer.processing_class
        envs = [self.make_env() for _ in prompts]
        for env, prompt in zip(envs, prompts):
            env.reset(self.task_by_prompt[self.prompt_key(prompt)])
        prompt_ids = [render_ids(tokenizer, env.episode.messages) for env in envs]
        completion_ids: list[list[int]] = [[] for _ in envs]
        env_mask: list[list[int]] = [[] for _ in envs]
        logprobs: list[list[float]] | None = [[] for _ in envs]
        answers = 0
        while active := [i for i, env in enumerate(envs) if not env.done]:
            contexts = [prompt_ids[i] + completion_ids[i] for i in active]
            generated, generated_logprobs = trainer._generate_single_turn(contexts, None, {}, 1)
            texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in generated]
            verdicts = self.evaluator.grade_many(Job(envs[i].episode.task, text, self.args.split)
                                                 for i, text in zip(active, texts))
            answers += len(active)
            for n, (i, ids, text, verdict) in enumerate(zip(active, generated, texts, verdicts)):
                before = list(envs[i].episode.messages)
                step = envs[i].record(text, verdict)
                completion_ids[i] += list(ids)
                env_mask[i] += [1] * len(ids)
                if logprobs is not None and generated_logprobs is not None:
                    logprobs[i] += list(generated_logprobs[n])
                else:
                    logprobs = None
                if not step.done:
                    feedback = feedback_ids(tokenizer, before, text, step.observation,
                                            ended=bool(ids) and ids[-1] == tokenizer.eos_token_id)
                    completion_ids[i] += feedback
                    env_mask[i] += [0] * len(feedback)
                    if logprobs is not None:
                        logprobs[i] += [0.0] * len(feedback)
        returns = [env.episode_return() for env in envs]
        row = batch_row(trainer.state.global_step, envs, returns, answers, time.monotonic() - started)
        self.log.append(row)
        self.console.print(summary_line(row), soft_wrap=True)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "env_mask": env_mask, "episode_return": returns}


def render_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The conversation as the model reads it before answering."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def feedback_ids(tokenizer: Any, before: list[dict[str, str]], answer: str, after: list[dict[str, str]],
                 ended: bool) -> list[int]:
    """The tokens between an answer and the next one: the chat markup closing the answer, the
    feedback message, and the markup opening the next answer. The generated tokens are kept as
    they were sampled (no re-tokenizing), so only this span is rendered and tokenized."""
    head = tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=True) + answer
    full = tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True)
    if not full.startswith(head):
        raise ConfigError("the model's chat template does not extend a conversation by appending to it; "
                          "multi-turn episodes need one that does (or set max_turns: 1)")
    suffix = full[len(head):]
    eos = tokenizer.eos_token
    if ended and eos and suffix.startswith(eos):  # the answer's own end-of-turn token was generated
        suffix = suffix[len(eos):]
    return tokenizer(suffix, add_special_tokens=False)["input_ids"]


def batch_row(step: int, envs: list[Any], returns: list[float], answers: int, seconds: float) -> dict[str, Any]:
    """What one rollout batch did: the figures the log and the plot show."""
    verdicts = [v for env in envs for v in env.episode.verdicts]
    finals = [env.episode.verdicts[-1] for env in envs]
    speedups = [s for v in finals if v.ok and (s := speedup_of(v)) is not None]
    return {"step": step, "episodes": len(envs), "answers": answers,
            "mean_return": sum(returns) / len(returns),
            "correct_rate": sum(v.ok for v in finals) / len(finals),
            "hack_rate": sum(is_hack(v) for v in verdicts) / len(verdicts),
            "mean_predicted_speedup": sum(speedups) / len(speedups) if speedups else None,
            "mean_turns": sum(env.episode.turn for env in envs) / len(envs),
            "statuses": dict(Counter(str(v.status) for v in verdicts)), "seconds": round(seconds, 2)}


def summary_line(row: dict[str, Any]) -> str:
    """One rollout batch as the console shows it."""
    speedup = row["mean_predicted_speedup"]
    return (f"[bold]step {row['step']}[/]: return {row['mean_return']:.3f}, correct {row['correct_rate']:.0%}, "
            f"hacks {row['hack_rate']:.0%}, speedup {'-' if speedup is None else f'{speedup:.2f}x'}, "
            f"{row['episodes']} episodes / {row['answers']} answers graded in {row['seconds']:.1f} s")


def episode_return(prompts: list, completions: list, episode_return: list[float], **_: Any) -> list[float]:
    """GRPOTrainer's reward function: the return the rollout computed for each episode."""
    return list(episode_return)


def resume_checkpoint(output_dir: str, resume: Any) -> str | None:
    """The checkpoint a resumed run starts from: `resume_from_checkpoint` as a path, or true for
    the last one in output_dir; None for a fresh run."""
    if not resume or str(resume).lower() == "false":
        return None
    from transformers.trainer_utils import get_last_checkpoint

    checkpoint = get_last_checkpoint(output_dir) if str(resume).lower() == "true" else str(resume)
    if checkpoint is None or not (Path(checkpoint) / "trainer_state.json").is_file():
        raise FileNotFoundError(f"resume_from_checkpoint: no checkpoint at {checkpoint or output_dir}")
    return checkpoint


def checkpoint_step(checkpoint: str | None) -> int | None:
    return None if checkpoint is None else json.loads((Path(checkpoint) / "trainer_state.json").read_text())[
        "global_step"]


def small_run(values: Any) -> list[str]:
    """Flags that make a CPU check of an RL config small: one step of short answers, two grading
    workers (a Ray cluster's address becomes a private one here), no re-benchmark, aside."""
    ray = ["--ray_address", "local"] if getattr(values, "ray_address", None) not in (None, "", "local") else []
    return ["--max_steps", "1", "--max_completion_length", "64", "--rebench", "false", *ray,
            "--grading_workers", "2", "--output_dir", "runs/rl-cpu-check"]


# The machine check's view of this entry point (training/preflight.py).
ENTRY = EntryPoint("training.rl", "configs/grpo-tiny.yaml", small_run=small_run)


def make_parser():
    from trl import GRPOConfig, ModelConfig, TrlParser

    return TrlParser((RLScriptArguments, GRPOConfig, ModelConfig), prog="python -m training.rl")


def build_trainer(script_args: RLScriptArguments, training_args: Any, model_args: Any, evaluator: Any):
    """The GRPOTrainer over the grader (model checked and, for smoke runs, built first)."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer, get_peft_config

    tasks = training_tasks(script_args)
    name = model_args.model_name_or_path
    if not name:
        raise ModelNotAvailable("no model: set model_name_or_path in the config or on the command line")
    env = KernelEnv(evaluator, tasks, script_args.split, script_args.max_turns, reward_spec(script_args),
                    script_args.context)
    script_args.build_if_asked(name, lambda: tiny_model_texts(env, tasks))
    require_model(name)
    training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}),
                                       "dtype": model_args.dtype, "revision": model_args.model_revision,
                                       "attn_implementation": model_args.attn_implementation}
    tokenizer = AutoTokenizer.from_pretrained(name, revision=model_args.model_revision, padding_side="left")
    log = RolloutLog(Path(training_args.output_dir) / LOG_NAME, checkpoint_step(training_args.resume_from_checkpoint))
    rollout = GraderRollout(evaluator, tasks, script_args, log)
    return GRPOTrainer(model=name, reward_funcs=[episode_return], args=training_args,
                       train_dataset=prompt_dataset(tasks, env, script_args.prompts_per_task),
                       processing_class=tokenizer, peft_config=get_peft_config(model_args), rollout_func=rollout), log


def tiny_model_texts(env: Any, tasks: list[Any]) -> list[str]:
    """What a smoke run's tokenizer learns from: the prompts it will read and our solutions."""
    import tasks as registry

    prompts = [m["content"] for t in tasks for m in env.first_messages(t)]
    return prompts + [t.solution_source() for t in registry.all_tasks()]


def plot_log(rows: list[dict[str, Any]], out: Path) -> None:
    """reward_curve.png: mean return, correct rate and hack rate per rollout batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    for key, label in (("mean_return", "mean return"), ("correct_rate", "correct"), ("hack_rate", "refused as a hack")):
        ax.plot(steps, [r[key] for r in rows], marker="o", label=label)
    ax.set_xlabel("training step (rollout batch)")
    ax.set_ylabel("per episode / per answer")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def rebench_lift(script_args: RLScriptArguments, training_args: Any, model_args: Any, tasks: list[Any]) -> Path:
    """Re-benchmark the base and the tuned model on the train split and the held-out one (held-out
    shapes, and the held-out tasks named in rebench_tasks); lift.md holds the report's tables."""
    from training import rebench

    out = Path(training_args.output_dir)
    base = model_args.model_name_or_path
    tuned = f"{base}+{out}" if model_args.use_peft else str(out)
    argv = ["--model", f"base={base}", "--model", f"tuned={tuned}", "--split", "train", "heldout",
            "--samples", str(script_args.rebench_samples), "--turns", str(script_args.rebench_turns),
            "--max-tokens", str(script_args.rebench_max_tokens), "--context", script_args.context,
            "--workers", str(script_args.grading_workers), "--out", str(out / "rebench"), "--fresh"]
    for name in script_args.rebench_tasks or [t.name for t in tasks]:
        argv += ["--task", name]
    if script_args.tpu:
        argv += ["--tpu", script_args.tpu]
    rebench.run(rebench.parse_args(argv))
    tables = (out / "rebench" / "report.md").read_text().split("\n", 2)[-1]  # below the report's title
    lift = out / "lift.md"
    lift.write_text(f"# Lift after RL: base vs tuned (training.rl)\n\n{tables}")
    return lift


def train(script_args: RLScriptArguments, training_args: Any, model_args: Any) -> dict[str, Any]:
    from evaluator.grader import Evaluator
    from evaluator.performance.hardware import DEFAULT_GENERATION

    reward_spec(script_args)  # a bad reward setting or task list fails before anything starts
    training_tasks(script_args)
    training_args.resume_from_checkpoint = resume_checkpoint(training_args.output_dir,
                                                             training_args.resume_from_checkpoint)
    with Evaluator(backend=script_args.grading_backend, workers=script_args.grading_workers,
                   generation=script_args.tpu or DEFAULT_GENERATION, executor="ray" if script_args.ray_address else "local",
                   address=script_args.ray_address, cache=script_args.verdict_cache) as evaluator:
        trainer, log = build_trainer(script_args, training_args, model_args, evaluator)
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    output_dir = Path(training_args.output_dir)
    trainer.save_model(str(output_dir))  # the LoRA adapter when PEFT is on, else the full model
    rows = log.rows()
    summary = {"steps": trainer.state.global_step, "rollouts": rows,
               "final": next((h for h in reversed(trainer.state.log_history) if "train_runtime" in h), {})}
    if rows:
        plot_log(rows, output_dir / "reward_curve.png")
    if script_args.rebench:
        summary["lift"] = str(rebench_lift(script_args, training_args, model_args, training_tasks(script_args)))
    (output_dir / "rl_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    import yaml

    from tasks import UnknownTaskError
    from training.sft import fail

    try:
        script_args, training_args, model_args = parse_checked(make_parser(), argv, ENTRY)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        return fail(exc)
    try:
        summary = train(script_args, training_args, model_args)
    except (ModelNotAvailable, UnknownTaskError, ConfigError, FileNotFoundError, ValueError) as exc:
        return fail(exc)
    last = (summary["rollouts"] or [{}])[-1]
    print(f"saved to {training_args.output_dir} (steps {summary['steps']}, last mean return "
          f"{last.get('mean_return', '-')}, correct {last.get('correct_rate', '-')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
