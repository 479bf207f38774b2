"""Re-benchmark models: k samples per task, graded by the evaluator, pass@k side by side.

    # base vs tuned, both served by vLLM (e.g. `vllm serve Qwen/... --enable-lora --lora-modules tuned=...`)
    python -m training.rebench --model base=Qwen/Qwen2.5-Coder-7B-Instruct@http://localhost:8000/v1 \\
                               --model tuned=tuned@http://localhost:8000/v1 --samples 8 --k 1 8
    # local checkpoints (transformers, offline): base directory, and base + LoRA adapter
    python -m training.rebench --model base=runs/tiny-model --model tuned=runs/tiny-model+runs/fixit-tiny-sft
    # generalization, model level: prompts and grading on held-out shapes of the training tasks,
    # and on the held-out tasks
    python -m training.rebench --split heldout --model ...

A model is `label=NAME@BASE_URL` (OpenAI-compatible endpoint), `label=DIR` (local Hugging Face
model) or `label=DIR+ADAPTER` (local model with a PEFT adapter). The report (report.json,
report.md, pass_at_k.png, samples.jsonl) goes to --out; the table is printed as well.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.metrics import fast_p, pass_at_k, status_shares


@dataclass(frozen=True)
class ModelSpec:
    label: str
    model: str
    base_url: str | None = None
    adapter: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        label, sep, rest = text.partition("=")
        if not sep or not label or not rest:
            raise ValueError(f"--model {text!r}: expected label=NAME@URL, label=DIR or label=DIR+ADAPTER")
        if "@" in rest:
            model, url = rest.rsplit("@", 1)
            return cls(label, model, base_url=url)
        model, _, adapter = rest.partition("+")
        return cls(label, model, adapter=adapter or None)

    def load(self):
        from chat.models import make_chat_model

        return make_chat_model(self.model, base_url=self.base_url, adapter=self.adapter)


@dataclass
class Sample:
    model: str
    task: str
    group: str   # "train tasks" or "held-out tasks"
    split: str   # the cases shown in the prompt and graded
    index: int
    status: str
    speedup: float | None
    message: str
    answer: str


def benchmark_tasks(split: str, names: list[str] | None) -> list[tuple[Any, str]]:
    """(task, group) pairs: train tasks on `split`; with split heldout, the held-out tasks too."""
    from tasks import all_tasks, get_task

    tasks = [get_task(n) for n in names] if names else all_tasks()
    if split == "train":
        return [(t, "train tasks") for t in tasks if not t.heldout_task]
    return [(t, "held-out tasks" if t.heldout_task else "train tasks") for t in tasks]


def sample_model(spec: ModelSpec, model: Any, tasks: list[tuple[Any, str]], split: str, n: int,
                 temperature: float, max_tokens: int, context: str, evaluator: Any,
                 concurrency: int) -> list[Sample]:
    """n answers per task from one model, each graded on the split's cases."""
    from chat.prompts import task_messages

    def one(job: tuple[Any, str, int]) -> Sample:
        task, group, index = job
        messages = task_messages(task, context, split=split, evaluation=True)
        answer = model.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=index)
        verdict = evaluator.grade(task, answer, split)
        return Sample(spec.label, task.name, group, split, index, verdict.status, verdict.speedup,
                      verdict.message, answer)

    jobs = [(task, group, i) for task, group in tasks for i in range(n)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, jobs))


def summarize(samples: list[Sample], ks: list[int], p: float) -> dict[str, Any]:
    """Per model: per task n, c, pass@k, fast_p and statuses; overall = mean over tasks (per group)."""
    by_model_task: dict[str, dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_model_task[s.model][s.task].append(s)
    report: dict[str, Any] = {}
    for model, per_task in by_model_task.items():
        rows = {}
        for task, group in per_task.items():
            n, c = len(group), sum(s.status == "correct" for s in group)
            statuses = [s.status for s in group]
            rows[task] = {"group": group[0].group, "n": n, "correct": c,
                          **{f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n},
                          f"fast_{p:g}": fast_p(statuses, [s.speedup for s in group], p),
                          "statuses": status_shares(statuses)}
        overall = {}
        for group_name in sorted({r["group"] for r in rows.values()}) + ["all"]:
            chosen = [r for r in rows.values() if group_name in ("all", r["group"])]
            overall[group_name] = {f"pass@{k}": sum(r[f"pass@{k}"] for r in chosen) / len(chosen)
                                   for k in ks if all(f"pass@{k}" in r for r in chosen)}
            overall[group_name]["statuses"] = status_shares([s.status for s in samples if s.model == model
                                                             and group_name in ("all", s.group)])
        report[model] = {"tasks": rows, "overall": overall}
    return report


def markdown(report: dict[str, Any], ks: list[int]) -> str:
    models = list(report)
    head = "| task | " + " | ".join(f"{m} pass@{k}" for m in models for k in ks) + " |"
    lines = [head, "|---|" + "---:|" * (len(models) * len(ks))]
    tasks = sorted({t for m in models for t in report[m]["tasks"]})
    for task in tasks:
        cells = [_pct(report[m]["tasks"].get(task, {}).get(f"pass@{k}")) for m in models for k in ks]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    for group in report[models[0]]["overall"]:
        cells = [_pct(report[m]["overall"].get(group, {}).get(f"pass@{k}")) for m in models for k in ks]
        lines.append(f"| **mean, {group}** | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def plot(report: dict[str, Any], ks: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report)
    groups = list(report[models[0]]["overall"])
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(groups) * len(ks), 3.8))
    width = 0.8 / len(models)
    labels = [f"{g}\npass@{k}" for g in groups for k in ks]
    for i, model in enumerate(models):
        values = [100 * report[model]["overall"].get(g, {}).get(f"pass@{k}", 0.0) for g in groups for k in ks]
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=model)
    ax.set_xticks([x + width * (len(models) - 1) / 2 for x in range(len(labels))], labels, fontsize=8)
    ax.set_ylabel("% (mean over tasks)")
    ax.set_ylim(0, 100)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.rebench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", dest="models", action="append", required=True,
                   help="label=NAME@URL | label=DIR | label=DIR+ADAPTER (repeat to compare)")
    p.add_argument("--split", choices=("train", "heldout"), default="train",
                   help="heldout: held-out shapes of the training tasks, plus the held-out tasks")
    p.add_argument("--task", dest="tasks", action="append")
    p.add_argument("--samples", type=int, default=4, help="answers per task (n)")
    p.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k to report (k <= samples)")
    p.add_argument("--fast-p", type=float, default=1.0, help="fast_p threshold (speedup over XLA)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--context", choices=("none", "spec", "guide"), default="none")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("runs/rebench"))
    args = p.parse_args(argv)
    if any(k > args.samples for k in args.k):
        p.error(f"every --k must be <= --samples ({args.samples})")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console

    from evaluator.grader import Evaluator

    specs = [ModelSpec.parse(m) for m in args.models]
    tasks = benchmark_tasks(args.split, args.tasks)
    samples: list[Sample] = []
    with Evaluator(workers=args.workers) as evaluator:
        for spec in specs:
            samples += sample_model(spec, spec.load(), tasks, args.split, args.samples, args.temperature,
                                    args.max_tokens, args.context, evaluator, args.concurrency)
    report = summarize(samples, args.k, args.fast_p)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "samples.jsonl").write_text("".join(json.dumps(asdict(s)) + "\n" for s in samples))
    (args.out / "report.json").write_text(json.dumps({"split": args.split, "models": [asdict(s) for s in specs],
                                                      "report": report}, indent=2))
    table = markdown(report, args.k)
    (args.out / "report.md").write_text(f"# Re-benchmark on {args.split} cases\n\n{table}")
    plot(report, args.k, args.out / "pass_at_k.png")
    Console().print(table)
    return report


def main(argv: list[str] | None = None) -> int:
    from chat.models import EndpointError
    from tasks import UnknownTaskError

    args = parse_args(argv)
    try:
        run(args)
    except (EndpointError, UnknownTaskError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
