"""Content hashes of what decides a verdict: the grading code and a task's files.

No version string is involved, so nobody has to remember to bump one: an edit to the grader or to
a task changes the hash. The variant pool keys its entries with these, and so do the verdict
cache and the rebench journals.

Only what decides a verdict counts: the modules the grader and its worker import (not the
command line, the tuner or anything else beside them), each as its syntax tree without
docstrings, so a reworded docstring, a comment or a reformatted line leaves every key as it was.
The feedback's wording is in string literals that are not docstrings, so it counts.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

from evaluator.candidate.policy import parse_module
from tasks.spec import Task

ROOT = Path(__file__).resolve().parent.parent
# Where grading starts: the host's side and the sandboxed worker's.
GRADING_ROOTS = ("evaluator.grader", "evaluator.execution.worker")


@functools.lru_cache(maxsize=1)
def evaluator_digest() -> str:
    """Hash of the grading code (GRADING_ROOTS and the `evaluator` modules they import) and the
    jax it grades with."""
    import jax

    return hashlib.sha256(f"jax {jax.__version__}\n{code_digest(GRADING_ROOTS)}".encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def code_digest(roots: tuple[str, ...]) -> str:
    """Hash of modules and every module of their own top-level packages they import, at any
    depth (function-level imports too), each as its syntax tree without docstrings."""
    h = hashlib.sha256()
    for name, path in sorted(import_closure(roots).items()):
        h.update(f"\0{name}\0{ast.dump(without_docstrings(parse_module(path.read_text())))}".encode())
    return h.hexdigest()


def import_closure(roots: tuple[str, ...]) -> dict[str, Path]:
    """module name -> file, for `roots` and what they import within the roots' packages."""
    packages = {r.split(".")[0] for r in roots}
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or (path := _module_file(name)) is None:
            continue
        found[name] = path
        for node in ast.walk(parse_module(path.read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]  # `from evaluator import stages`
        todo = [t for t in todo if t.split(".")[0] in packages]
        if "." in name:
            todo.append(name.rpartition(".")[0])  # a module's package __init__ runs first
    return found


def without_docstrings(tree: ast.Module) -> ast.Module:
    """The tree with the docstring of the module and of every class and function removed."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _module_file(name: str) -> Path | None:
    """The source file of one of our modules, without importing it; None for a name that is not a
    module (an imported class or function)."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def task_files(task: Task) -> list[Path]:
    """task.py and every `tasks` module it imports, transitively (spec, references, the tasks
    it builds on): the files that decide its cases, inputs, reference and tolerances."""
    start = task.solution_path.parent / "task.py"
    seen: dict[Path, None] = {}
    todo = [start]
    while todo:
        path = todo.pop()
        if path is None or path in seen or not path.is_file():
            continue
        seen[path] = None
        for node in ast.walk(parse_module(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tasks":
                todo.append(_module_file(node.module))
            elif isinstance(node, ast.Import):
                todo += [_module_file(a.name) for a in node.names if a.name.split(".")[0] == "tasks"]
    return sorted(seen)


def task_digest(task: Task) -> str:
    """Hash of a task's files (their paths and contents). An imported task has no task.py: its
    file's text, its cases and the code that runs its reference (the adapter's digest, which the
    adapter computes: the core names no adapter) decide its verdicts."""
    h = hashlib.sha256()
    if task.external is not None:
        h.update((task.reference_text or "").encode())
        h.update(repr([c.to_dict() for c in task.cases]).encode())
        h.update(task.external.code_digest().encode())
        return h.hexdigest()
    for path in task_files(task):
        h.update(f"\0{path.relative_to(ROOT)}\0{ast.dump(without_docstrings(parse_module(path.read_text())))}".encode())
    return h.hexdigest()
