"""Stage 1: find the candidate's source in a model's answer."""
from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from evaluator.candidate.policy import parse_module

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_PYTHON_TAGS = {"", "python", "py", "python3"}
# A fence line that opens a python block (or an untagged one).
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(python3?|py)?[ \t]*$", re.M | re.I)


# Statements that make a text code rather than prose that happens to parse.
_CODE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


class ExtractionError(ValueError):
    pass


def extract_code(answer: str, entry_points: str | Sequence[str] = "kernel") -> str:
    """The candidate's source: a Python file as it is, else the answer's last fenced python block.

    A file that parses and defines `kernel` (or one of the task's own entry points: an imported
    task's `workload`, `ModelNew` or the `Model` a KernelBench answer rewrites) at module top
    level is graded whole, whatever its docstrings and comments contain: real code carries ```
    examples in its docstrings. Anything else is a model's answer, prose plus code, and its last
    python block is its final word, unless a python fence opened after it never closes: the
    answer was cut off mid-code, and an earlier snippet is not what it meant to submit. Text
    without any fence that does not parse is still taken whole when a line starts with an entry
    point's definition (a truncated file): the policy stage then reports its syntax.
    """
    wanted = (entry_points,) if isinstance(entry_points, str) else tuple(entry_points)
    names = {"kernel", *wanted}
    tree = _parse(answer)
    if tree is not None and any(_binds(stmt, names) for stmt in tree.body):
        return answer
    blocks = list(_FENCE.finditer(answer))
    matches = [m for m in blocks if m.group(1).lower() in _PYTHON_TAGS]
    if _OPEN_FENCE.search(answer[blocks[-1].end():] if blocks else answer):
        raise ExtractionError("the answer ends inside a ```python block that never closes: it was "
                              "cut off before its code was complete (a truncated answer)")
    if matches:
        code = matches[-1].group(2)
        if not code.strip():
            raise ExtractionError("the last ```python block is empty")
        return code
    if "```" in answer:
        raise ExtractionError("no complete ```python code block found in the answer")
    pattern = "|".join(re.escape(n) for n in sorted(names))
    if tree is None and re.search(rf"^(async\s+def|def|class)\s+({pattern})\b", answer, re.M):
        return answer
    if tree is not None and any(isinstance(stmt, _CODE) for stmt in tree.body):
        raise ExtractionError(f"the code defines no {' or '.join(wanted)} (nor kernel) at the top level of "
                              "the module: the answer is incomplete, or its entry point has another name")
    raise ExtractionError(f"the answer contains no code: expected a ```python block defining "
                          f"{wanted[0]}(...) at the top level of the module")


def _parse(text: str) -> ast.Module | None:
    try:
        return parse_module(text)
    except (SyntaxError, ValueError, RecursionError):  # ValueError: a null byte in the text
        return None


def _binds(stmt: ast.stmt, names: set[str]) -> bool:
    """The module-level statement binds one of `names`: a def, a class or an assignment, also
    under a module-level if/try/with (a function's or a class's body is not the module's)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name in names
    if isinstance(stmt, ast.Assign):
        return any(_assigns(target, names) for target in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return stmt.value is not None and _assigns(stmt.target, names)
    if isinstance(stmt, (ast.If, ast.Try, ast.With)) or type(stmt).__name__ == "TryStar":
        blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
        return any(_binds(s, names) for block in blocks for s in block)
    return False


def _assigns(target: ast.expr, names: set[str]) -> bool:
    if isinstance(target, ast.Name):
        return target.id in names
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_assigns(t, names) for t in target.elts)
    return isinstance(target, ast.Starred) and _assigns(target.value, names)
