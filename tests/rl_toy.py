"""A toy policy for tests/test_rl.py: a tiny model that answers transpose_2d's prompt with, at even
odds, a correct kernel or the same kernel with its output block index swapped, which the grader
refuses. Its answers branch at one token and are otherwise memorised (a sliding window of 8
tokens, so what follows the branch is the same text in both), so GRPO's only lever is that token.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASK = "transpose_2d"
RIGHT_INDEX, WRONG_INDEX = "lambda i, j: (j, i)", "lambda i, j: (i, j)"


def answers() -> dict[str, str]:
    """The task's solution without its docstring, and the wrong variant, as model answers."""
    from tasks import get_task

    source = get_task(TASK).solution_source().split('"""', 2)[2].lstrip("\n")
    assert source.count(RIGHT_INDEX) == 1, "the toy needs the solution's out_specs index map"
    return {"correct": f"```python\n{source.rstrip()}\n```",
            "wrong": f"```python\n{source.replace(RIGHT_INDEX, WRONG_INDEX).rstrip()}\n```"}


@dataclass
class ToyPolicy:
    root: Path
    prompt: list[dict[str, str]]
    answers: dict[str, str]

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def out_dir(self) -> Path:
        return self.root / "grpo"

    @classmethod
    def build(cls, root: Path, steps: int = 80) -> "ToyPolicy":
        """Build the tiny model and teach it both answers (a plain full fine-tuning loop)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from chat.prompts import task_messages
        from tasks import get_task
        from training.tiny_model import build_tiny_model

        prompt = task_messages(get_task(TASK), "none", "v5e", evaluation=True)
        toy = cls(root, prompt, answers())
        texts = [m["content"] for m in prompt] + list(toy.answers.values())
        build_tiny_model(toy.model_dir, texts * 10, vocab_size=600, hidden=128, layers=2, heads=4, sliding_window=8)
        tokenizer = AutoTokenizer.from_pretrained(toy.model_dir)
        model = AutoModelForCausalLM.from_pretrained(toy.model_dir)
        batch = [toy.sequence(tokenizer, name) for name in ("correct", "wrong")]
        torch.manual_seed(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            loss = sum(model(input_ids=ids[None], labels=labels[None]).loss for ids, labels in batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.save_pretrained(toy.model_dir)
        return toy

    def sequence(self, tokenizer, name: str):
        """(input ids, labels) of the prompt and one answer; the loss covers the answer only."""
        import torch

        from training.rl import render_ids

        prompt = render_ids(tokenizer, self.prompt)
        answer = tokenizer(self.answers[name], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor(prompt + answer)
        labels = torch.tensor([-100] * len(prompt) + answer)
        return ids, labels

    def log_probs(self, adapter: bool = False) -> dict[str, float]:
        """log p(answer | prompt) of each answer, by the base model or with the GRPO adapter."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.out_dir)
        model.eval()
        out = {}
        with torch.no_grad():
            for name in self.answers:
                ids, labels = self.sequence(tokenizer, name)
                n = int((labels != -100).sum())
                out[name] = -float(model(input_ids=ids[None], labels=labels[None]).loss) * n
        return out

    def grpo(self, steps: int) -> None:
        """GRPO steps through training.rl, episodes of one answer graded by the real grader."""
        from transformers import AutoTokenizer

        from evaluator.grader import Evaluator
        from training.rl import build_trainer, make_parser

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        longest = max(len(tokenizer(a)["input_ids"]) for a in self.answers.values()) + 8
        script_args, training_args, model_args = make_parser().parse_args_and_config([
            "--model_name_or_path", str(self.model_dir), "--tasks", TASK, "--max_turns", "1",
            "--prompts_per_task", str(steps), "--verdict_cache", str(self.root / "verdicts"),
            "--rebench", "false", "--output_dir", str(self.out_dir), "--max_steps", str(steps),
            "--per_device_train_batch_size", "4", "--num_generations", "4",
            "--max_completion_length", str(longest), "--temperature", "0.7", "--beta", "0.0",
            "--learning_rate", "5e-3", "--use_peft", "--lora_r", "8", "--lora_alpha", "16",
            "--lora_dropout", "0.0", "--lora_target_modules", "all-linear", "--dtype", "float32",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--seed", "0"])
        with Evaluator(backend="tpu-interpret", workers=2, cache=script_args.verdict_cache) as evaluator:
            trainer, _ = build_trainer(script_args, training_args, model_args, evaluator)
            trainer.train()
        trainer.save_model(str(self.out_dir))

    def statuses_seen(self) -> set[str]:
        rows = [json.loads(line) for line in (self.out_dir / "rl_log.jsonl").read_text().splitlines()]
        return {status for row in rows for status in row["statuses"]}
