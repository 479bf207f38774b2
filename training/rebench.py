"""Re-benchmark models: k conversations per task, each up to --turns answers, graded by the evaluator.

    # base vs tuned, both served by vLLM (e.g. `vllm serve Qwen/... --enable-lora --lora-modules tuned=...`)
    python -m training.rebench --model base=Qwen/Qwen2.5-Coder-7B-Instruct@http://localhost:8000/v1 \\
                               --model tuned=tuned@http://localhost:8000/v1 --samples 8 --k 1 8 --turns 3
    # local checkpoints (transformers, offline): base directory, and base + LoRA adapter
    python -m training.rebench --model base=runs/tiny-model --model tuned=runs/tiny-model+runs/fixit-tiny-sft
    # generalization, model level: prompts, feedback and grading on held-out shapes of the training
    # tasks, and on the held-out tasks (--split train heldout: both in one run)
    python -m training.rebench --split heldout --model ...

A model is `label=NAME@BASE_URL` (OpenAI-compatible endpoint), `label=DIR` (local Hugging Face
model) or `label=DIR+ADAPTER` (local model with a PEFT adapter). After a failing answer the model
reads the evaluator's feedback, built by the same function as a Fixit row's (chat.prompts.
repair_messages), and answers again. Every graded answer is journaled (<out>/journal.jsonl): a
killed run, rerun with the same arguments, resumes without asking again. The report (report.json,
report.md, turns.png, samples.jsonl) goes to --out; the tables are printed as well.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cli.options import (UsageError, add_scale_options, add_suite_option, generation_for, open_resolver, resolve_tasks,
                         scale_kwargs)
from data_gen.rows.journal import Journal, JournalMismatch
from evaluator.record import Verdict
from training.rebench_report import GROUPS, Sample, Turn, markdown, plot_turns, report_document, summarize, turn_curves


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


def benchmark_tasks(split: str, names: list[str] | None, resolver: Any) -> list[tuple[Any, str]]:
    """(task, group) pairs: train tasks on `split`; with split heldout, the held-out tasks too.
    With a peer suite (--suite), its tasks instead of ours (cli.options.resolve_tasks)."""
    train_group, heldout_group = GROUPS
    tasks = resolve_tasks(resolver, names)
    if split == "train":
        return [(t, train_group) for t in tasks if not t.heldout_task]
    return [(t, heldout_group if t.heldout_task else train_group) for t in tasks]


@dataclass(frozen=True)
class Conversation:
    """Which conversation: model, split, task, sample index."""

    model: str
    split: str
    task: Any
    group: str
    index: int

    @property
    def key(self) -> str:
        return f"{self.model}|{self.split}|{self.task.name}|{self.index}"


class LazyModel:
    """A model loaded on first use: a resumed run whose model has nothing left to answer never
    loads it (nor needs its server up)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self._model = None
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        with self._lock:
            if self._model is None:
                self._model = self.spec.load()
        return self._model.complete(messages, **kwargs)


class Rebench:
    """Runs conversations: asks, grades, journals each answer, feeds the verdict back."""

    def __init__(self, args: argparse.Namespace, evaluator: Any, journal: Journal):
        self.args, self.evaluator, self.journal = args, evaluator, journal
        self.answers = answers_by_conversation(journal)

    def finished(self, conv: Conversation) -> bool:
        done = self.answers.get(conv.key, [])
        return bool(done) and (len(done) >= self.args.turns or done[-1]["verdict"]["status"] == "correct")

    def converse(self, conv: Conversation, model: LazyModel) -> None:
        """Ask until an answer is correct or --turns answers were given; the conversation so far
        (journaled answers included) is what the model reads."""
        from chat.prompts import repair_messages, task_messages

        messages = task_messages(conv.task, self.args.context, self.args.tpu, split=conv.split, evaluation=True)
        turn = 0
        for entry in self.answers.get(conv.key, []):
            turn, verdict = entry["turn"], Verdict.from_dict(entry["verdict"])
            if verdict.ok:
                return
            messages = repair_messages(messages, entry["answer"], verdict)
        while turn < self.args.turns:
            turn += 1
            answer = model.complete(messages, temperature=self.args.temperature,
                                    max_tokens=self.args.max_tokens, seed=conv.index)
            verdict = self.evaluator.grade(conv.task, answer, conv.split)
            self.journal.append({"kind": "answer", "id": f"{conv.key}|{turn}", "conversation": conv.key,
                                 "turn": turn, "answer": answer, "verdict": verdict.to_dict()})
            if verdict.ok:
                return
            messages = repair_messages(messages, answer, verdict)


def answers_by_conversation(journal: Journal) -> dict[str, list[dict[str, Any]]]:
    """Journaled answers per conversation key, in turn order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted((e for e in journal.entries if e.get("kind") == "answer"), key=lambda e: e["turn"]):
        out[e["conversation"]].append(e)
    return out


def samples_from(journal: Journal, conversations: list[Conversation]) -> list[Sample]:
    """Every conversation of this run that has answers, as a Sample, from the journal."""
    answers = answers_by_conversation(journal)
    samples = []
    for c in conversations:
        if answers.get(c.key):
            turns = [Turn(e["turn"], e["verdict"]["status"], e["verdict"].get("speedup"), e["verdict"]["message"],
                          e["answer"], (e["verdict"].get("predicted_speedup") or {}).get("overall"))
                     for e in answers[c.key]]
            samples.append(Sample(c.model, c.task.name, c.group, c.task.level, c.split, c.index, turns))
    return samples


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from evaluator.execution.backends import BACKENDS
    from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS

    p = argparse.ArgumentParser(prog="python -m training.rebench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", dest="models", action="append", required=True,
                   help="label=NAME@URL | label=DIR | label=DIR+ADAPTER (repeat to compare)")
    p.add_argument("--split", dest="splits", nargs="+", choices=("train", "heldout"), default=["train"],
                   help="heldout: held-out shapes of the training tasks, plus the held-out tasks")
    p.add_argument("--task", dest="tasks", action="append")
    p.add_argument("--samples", type=int, default=4, help="conversations per task and split (n)")
    p.add_argument("--turns", type=int, default=1, help="answers per conversation at most (1: no repair)")
    p.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k to report (k <= samples)")
    p.add_argument("--fast-p", type=float, default=1.0, help="fast_p threshold (speedup over XLA)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--context", choices=("none", "spec", "guide"), default="none")
    p.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                   help="evaluator backend (default: tpu on a TPU host, else tpu-interpret)")
    p.add_argument("--tpu", choices=tuple(GENERATIONS), default=None,
                   help=f"TPU generation for the prompt's context, VMEM budget and compiler (default "
                        f"{DEFAULT_GENERATION}, or the one a --suite was tuned for: v6e for JAXBench)")
    p.add_argument("--workers", type=int, default=2, help="evaluator worker processes (Ray actors with --ray)")
    add_scale_options(p)
    add_suite_option(p)
    p.add_argument("--concurrency", type=int, default=8, help="conversations in flight")
    p.add_argument("--out", type=Path, default=Path("runs/rebench"))
    p.add_argument("--fresh", action="store_true", help="discard the journal in --out and start over")
    args = p.parse_args(argv)
    if any(k > args.samples for k in args.k):
        p.error(f"every --k must be <= --samples ({args.samples})")
    if args.turns < 1:
        p.error("--turns must be at least 1")
    args.splits = sorted(set(args.splits), key=("train", "heldout").index)
    return args


def settings_of(args: argparse.Namespace, specs: list[ModelSpec], backend: str) -> dict[str, Any]:
    """What decides the answers and verdicts: a resumed run must use the same (pass@k and
    fast_p thresholds are read off the journal, so they may change)."""
    return {"models": [asdict(s) for s in specs], "splits": args.splits, "tasks": args.tasks,
            "samples": args.samples, "turns": args.turns, "temperature": args.temperature,
            "max_tokens": args.max_tokens, "context": args.context, "backend": backend, "tpu": args.tpu,
            "suite": args.suite}


def report_settings(args: argparse.Namespace, evaluator: Any) -> dict[str, Any]:
    """The settings a report (and a leaderboard row) was measured with."""
    import jax

    from evaluator.digest import evaluator_digest
    from evaluator.grader import EVALUATOR_VERSION

    return {"samples": args.samples, "k": args.k, "turns": args.turns, "fast_p": args.fast_p,
            "temperature": args.temperature, "max_tokens": args.max_tokens, "context": args.context,
            "splits": args.splits, "tasks": args.tasks or "all", "backend": evaluator.backend.name,
            "tpu_generation": args.tpu, "numerics": evaluator.numerics, "evaluator_version": EVALUATOR_VERSION,
            "evaluator_code": evaluator_digest()[:12], "jax": jax.__version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with open_resolver(args.suite) as resolver:
        return _run(args, resolver)


def _run(args: argparse.Namespace, resolver: Any) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evaluator.grader import Evaluator

    console = Console(stderr=True)
    specs = [ModelSpec.parse(m) for m in args.models]
    if len({s.label for s in specs}) < len(specs):
        raise ValueError("two --model options share a label: give each model its own")
    selected = {split: benchmark_tasks(split, args.tasks, resolver) for split in args.splits}
    args.tpu = generation_for(args.tpu, [t for pairs in selected.values() for t, _ in pairs])
    conversations = [Conversation(spec.label, split, task, group, i) for spec in specs for split in args.splits
                     for task, group in selected[split] for i in range(args.samples)]
    journal_path = args.out / "journal.jsonl"
    with Evaluator(backend=args.backend, workers=args.workers, generation=args.tpu,
                   **scale_kwargs(args)) as evaluator:
        if args.fresh and journal_path.exists():
            journal_path.unlink()
        journal = Journal(journal_path, settings_of(args, specs, evaluator.backend.name), new_run_option="--out")
        bench = Rebench(args, evaluator, journal)
        todo = [c for c in conversations if not bench.finished(c)]
        console.print(f"{len(conversations)} conversations (up to {args.turns} answers each); "
                      f"{len(conversations) - len(todo)} already finished in {journal_path}, {len(todo)} to do")
        models = {s.label: LazyModel(s) for s in specs}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, disable=not todo) as progress:
            bar = progress.add_task("conversations", total=len(todo))
            pool = ThreadPoolExecutor(max_workers=args.concurrency)
            try:
                futures = [pool.submit(bench.converse, c, models[c.model]) for c in todo]
                for future in as_completed(futures):
                    future.result()
                    progress.advance(bar)
            finally:  # on an error or Ctrl-C, stop at once: every graded answer is journaled
                pool.shutdown(wait=False, cancel_futures=True)
        settings = report_settings(args, evaluator)
    samples = samples_from(journal, conversations)
    results = summarize(samples, args.k, args.turns, args.fast_p)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "samples.jsonl").write_text("".join(json.dumps(s.record()) + "\n" for s in samples))
    report = report_document(settings, [asdict(s) for s in specs], results)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    tables = markdown(results, args.k, args.turns)
    (args.out / "report.md").write_text(f"# Re-benchmark ({', '.join(args.splits)} split, "
                                        f"up to {args.turns} turns)\n\n{tables}")
    plot_turns(turn_curves(results), args.out / "turns.png")
    Console().print(tables)
    return report


def main(argv: list[str] | None = None) -> int:
    from chat.models import EndpointError
    from tasks import UnknownTaskError

    args = parse_args(argv)
    try:
        run(args)
    except (EndpointError, UnknownTaskError, JournalMismatch, UsageError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every graded answer is in the journal; run the same command again to resume",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
