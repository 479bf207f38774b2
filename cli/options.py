"""The options every subcommand shares (--suite, --ray, --cache, --backend/--tpu/--seed...),
the console, the usage error and the helpers that turn options into tasks and an Evaluator.
data_gen and training reuse add_scale_options/scale_kwargs and the --suite helpers."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from rich.console import Console

from evaluator.execution.backends import BACKENDS
from evaluator.execution.protocol import SEED_CHECKS
from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class UsageError(Exception):
    """A mistake in how the command was called: one line on stderr, exit 2."""


def add_common_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that grades: backend, generation, seed, timeout, --json,
    --exact-dots, --ray/--cache and --suite."""
    p.add_argument("--backend", choices=tuple(BACKENDS), default=None,
                   help="default: tpu on a TPU host, else tpu-interpret")
    p.add_argument("--tpu", choices=tuple(GENERATIONS), default=None,
                   help=f"TPU generation whose VMEM budget applies (default {DEFAULT_GENERATION}, "
                        "or the one an imported suite was tuned for: v6e for JAXBench)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: fresh each run)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per worker step (default 120); a case's run gets more where its "
                        "kernels do more work in interpret mode, up to --run-ceiling")
    p.add_argument("--run-ceiling", type=float, default=None,
                   help="the most seconds one case's run may be granted (default 900)")
    p.add_argument("--seed-checks", choices=SEED_CHECKS, default="auto",
                   help="interpret mode: where the race detector runs. auto (default): on the first seed "
                        "of a case whose kernels start DMAs, and on its other seeds unless dropping it "
                        "is faster; full: every seed of every case; cheap: never after a first seed")
    p.add_argument("--json", action="store_true", help="print the verdict record(s) as JSON")
    p.add_argument("--exact-dots", action="store_true",
                   help="interpret mode: compute f32 dots in kernels exactly, not as a TPU does "
                        "at default precision (one bf16 pass)")
    add_scale_options(p)
    add_suite_option(p)


def add_suite_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", metavar="KIND:PATH", default=None,
                   help="also take tasks from a peer suite's checkout: jaxbench:PATH (a clone of "
                        "JAXBench: jaxbench/<workload>, kernelbench-jax/level1|2/<problem>)")


@contextlib.contextmanager
def open_suite_option(spec: str | None):
    """The --suite checkout (None without one), closed afterwards; a bad value is a UsageError."""
    if spec is None:
        yield None
        return
    from suites import SuiteError, open_suite

    try:
        suite = open_suite(spec)
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    with suite:
        yield suite


@contextlib.contextmanager
def open_resolver(spec: str | None):
    """Tasks by name, ours and those of the --suite checkout (suites/resolver.py), closed
    afterwards; a bad --suite is a UsageError."""
    from suites import SuiteError
    from suites.resolver import TaskResolver

    try:
        resolver = TaskResolver([spec] if spec else [])
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    with resolver:
        yield resolver


def resolve_tasks(resolver, names: list[str] | None) -> list:
    """Tasks by name (every task of the suite in use, else ours, without names); an unknown name
    or an entry that cannot load is a UsageError. Loading a whole suite says so while it works."""
    import tasks
    from suites import LoadError

    try:
        if not names:
            if not resolver.suites:
                return resolver.tasks()
            with console.status(f"loading the tasks of {', '.join(str(s.root) for s in resolver.suites)}"):
                return resolver.tasks()
        found = []
        for name in names:
            try:
                found.append(resolver.task(name))
            except LoadError as exc:
                raise UsageError(f"cannot load {name}: {exc}") from None
        return found
    except tasks.UnknownTaskError as exc:
        raise UsageError(str(exc)) from None


def generation_for(requested: str | None, selected: list) -> str:
    """--tpu if given, else the generation the selected tasks were tuned for (when they agree),
    else the default."""
    if requested:
        return requested
    wanted = {t.tpu for t in selected if t.tpu}
    return wanted.pop() if len(wanted) == 1 else DEFAULT_GENERATION


def add_scale_options(p: argparse.ArgumentParser) -> None:
    """--ray and --cache: the same two options on every command that grades many candidates."""
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="grade on a Ray cluster: auto, ray://HOST:10001, or local (a private one); "
                        "--workers becomes the number of actors. Needs pip install -e '.[ray]'")
    p.add_argument("--cache", metavar="DIR", type=Path, default=None,
                   help="verdict cache folder: a candidate graded before with the same settings is not "
                        "graded again (its verdict comes back marked cached)")


def scale_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """Evaluator keyword arguments for --ray and --cache."""
    return {"executor": "ray" if args.ray else "local", "address": args.ray, "cache": args.cache}


def make_evaluator(args: argparse.Namespace, workers: int = 1, selected: list = ()):
    """The Evaluator the common options ask for; a bad combination is a UsageError."""
    from evaluator.execution.sandbox import Limits
    from evaluator.grader import Evaluator

    given = {"step_timeout_s": args.timeout, "run_ceiling_s": args.run_ceiling}
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    try:
        return Evaluator(backend=args.backend, workers=workers, limits=limits,
                         generation=generation_for(args.tpu, list(selected)),
                         tpu_numerics=not args.exact_dots, seed_checks=args.seed_checks,
                         **scale_kwargs(args))
    except ValueError as exc:  # e.g. tpu-compile without libtpu installed
        raise UsageError(str(exc)) from None


def model_attempts(root: Path, wanted: list[str]) -> list:
    """The generated kernels of the `wanted` models (all when empty) of a JAXBench checkout
    (suites/attempts.py); a model without any is a UsageError."""
    from suites import attempts as att

    available = att.models(root)
    unknown = [m for m in wanted if m not in available]
    if unknown or not available:
        raise UsageError(f"no generated kernels of {', '.join(unknown) or 'any model'} under "
                         f"{root / att.GENERATED} (models: {', '.join(available) or 'none'})")
    return att.discover(root, wanted or available)


def read_candidate(name: str) -> str:
    """The text of a candidate file (a .py file or a model answer)."""
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"candidate file not found: {path}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
