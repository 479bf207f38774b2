"""Content hashes of what decides a verdict: the evaluator's code and a task's files.

No version string is involved, so nobody has to remember to bump one: an edit to the grader or to
a task changes the hash. The variant pool keys its entries with these, and so does the verdict
cache.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

from evaluator.policy import parse_module
from tasks.spec import Task

ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def evaluator_digest() -> str:
    """Hash of the evaluator's code and the jax it grades with."""
    import jax

    h = hashlib.sha256(f"jax {jax.__version__}\n".encode())
    for path in sorted((ROOT / "evaluator").rglob("*.py")):
        h.update(f"{path.relative_to(ROOT)}\n".encode() + path.read_bytes())
    return h.hexdigest()


def task_files(task: Task) -> list[Path]:
    """task.py and every `tasks` module it imports, transitively (spec, references, the tasks
    it builds on): the files that decide its cases, inputs, reference and tolerances."""
    start = task.solution_path.parent / "task.py"
    seen: dict[Path, None] = {}
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen[path] = None
        for node in ast.walk(parse_module(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tasks":
                todo.append(_module_path(node.module))
            elif isinstance(node, ast.Import):
                todo += [_module_path(a.name) for a in node.names if a.name.split(".")[0] == "tasks"]
    return sorted(seen)


def task_digest(task: Task) -> str:
    """Hash of a task's files (their paths and contents). An imported task (suites/) has no
    task.py: its file's text, its cases and the adapter's code decide its verdicts."""
    h = hashlib.sha256()
    if task.external is not None:
        h.update((task.reference_text or "").encode())
        h.update(repr([c.to_dict() for c in task.cases]).encode())
        for path in sorted((ROOT / "suites").glob("*.py")):
            h.update(f"\0{path.relative_to(ROOT)}\0".encode() + path.read_bytes())
        return h.hexdigest()
    for path in task_files(task):
        h.update(f"\0{path.relative_to(ROOT)}\0".encode() + path.read_bytes())
    return h.hexdigest()


def _module_path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
