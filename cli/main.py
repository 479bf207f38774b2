"""Command line: `python -m evaluator tasks|run|check-solutions|check-suite|estimate|tune`
(stable: scripts rely on it; evaluator/__main__.py launches it).

Exit codes: 0 when a verdict was reached (whatever it is), 2 for a usage error (unknown
task, missing file), 1 from check-solutions when a reference solution is not correct.
"""
from __future__ import annotations

import argparse
import sys

from cli import calibrate_cmd, check_cmd, estimate_cmd, run_cmd, tasks_cmd, tune_cmd
from cli.options import UsageError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand, in the order --help lists them."""
    p = argparse.ArgumentParser(prog="python -m evaluator",
                                description="Grade Pallas TPU kernels against the task suite.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (tasks_cmd, run_cmd, check_cmd, estimate_cmd, calibrate_cmd, tune_cmd):
        module.add_parser(sub)
    return p
