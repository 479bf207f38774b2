"""Run a benchmark script on a git worktree of another revision: the before of a before/after.

The script runs in its own process on the worktree, so it imports that tree's evaluator; the
environment variable BENCHMARK_ROOT tells it which tree that is (a revision older than the
script is measured by our copy of the script, run on its tree).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT_VARIABLE = "BENCHMARK_ROOT"


def root(script: str) -> Path:
    """The tree a benchmark measures: BENCHMARK_ROOT when a baseline run set it, else the
    repository the script lives in."""
    return Path(os.environ.get(ROOT_VARIABLE) or Path(script).resolve().parent.parent)


def run_at(rev: str, script: str, args: list[str], inputs: dict[str, Any] | None = None) -> Any:
    """Run `script` (a file of benchmarks/) with `args` plus `--json OUT` on a worktree of `rev`
    and return what it wrote to OUT. `inputs` (name -> JSON-able value) are written to files the
    arguments can name as `{name}` (the sample both sides grade)."""
    here = root(__file__)
    with tempfile.TemporaryDirectory(prefix="benchmark-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            files = {}
            for name, value in (inputs or {}).items():
                files[name] = Path(tmp) / f"{name}.json"
                files[name].write_text(json.dumps(value))
            out = Path(tmp) / "out.json"
            theirs = tree / "benchmarks" / Path(script).name
            runner = theirs if theirs.exists() else Path(script).resolve()
            cmd = [sys.executable, str(runner), *[a.format(**files) for a in args], "--json", str(out)]
            subprocess.run(cmd, check=True, cwd=tree, env={**os.environ, ROOT_VARIABLE: str(tree)})
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
