"""Giveaways: differences between a failing kernel and its repair that are not the fix.

A model trained on pairs learns whatever tells the two sides apart. When a mutation strips the
docstring from the failing kernel only, leaves a name computed and never read (`in_group`), or
writes `x = x`, the cheapest thing to learn is "put the docstring back" or "use the dead name",
not the bug. Row rules (`row_giveaways`) find those; dataset rules (`dataset_giveaways`) find a
kind above its share cap or one edit repeated in one task. The card counts both, the collector
drops rows that break a row rule, and tests/test_dataset_rules.py holds the committed dataset to
all of them being zero.
"""
from __future__ import annotations

import ast
import difflib
import functools
import io
import re
import tokenize
from collections import Counter

from data_gen.failures.fingerprint import canonical
from evaluator.candidate.policy import parse_module

ROW_RULES = ("annotation_differs", "dead_name", "self_assignment")
DATASET_RULES = ("kind_over_cap", "repeated_edit")
MAX_ROWS_PER_EDIT = 2  # per (task, edit with numbers masked)
REWRITE_SHARE = 0.5  # difflib's ratio below which a repair rewrites the failing answer
_NUMBER = re.compile(r"(?<![\w.])\d+(\.\d+)?(e-?\d+)?\b")


def leftovers(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound by a plain assignment or an undecorated def that nothing reads, and names
    assigned to themselves (`x = x`)."""
    read, bound, selfs = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Store):
                read.add(node.id)
        elif isinstance(node, ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound.add(node.targets[0].id)
                if isinstance(node.value, ast.Name) and node.value.id == node.targets[0].id:
                    selfs.add(node.value.id)
        elif isinstance(node, ast.FunctionDef) and not node.decorator_list:
            bound.add(node.name)
    return bound - read, selfs


@functools.lru_cache(maxsize=64)
def _annotations(source: str) -> tuple[tuple[tuple[int, str], ...], frozenset[int]]:
    """(line, text) of every comment and docstring, and the lines docstrings span. Cached: a repair
    is checked against each of its mutants."""
    out, doc_lines = [], set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], " ".join(tok.string.split())))
        tree = parse_module(source)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return tuple(out), frozenset(doc_lines)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0]
                out.append((first.lineno, " ".join(doc.split())))
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
    return tuple(out), frozenset(doc_lines)


def _fixed_lines(failing: str, repair: str, docs: tuple[frozenset[int], frozenset[int]]) -> tuple[set[int], set[int]]:
    """Lines (1-based) of each side inside a diff hunk that changes code: a hunk of comments or
    docstrings alone is no part of a fix. A rewrite (the two sides share under REWRITE_SHARE of
    their lines, as a plain-jax answer and a Pallas repair do) changes every line: the few lines
    it keeps, a helper's `def` line, say, are a coincidence of the diff, not a place a fix left alone."""
    a, b = failing.splitlines(), repair.splitlines()

    def code(lines: list[str], number: int, doc_lines: set[int]) -> bool:
        text = lines[number - 1].strip()
        return bool(text) and not text.startswith("#") and number not in doc_lines

    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    if matcher.ratio() < REWRITE_SHARE:
        return set(range(1, len(a) + 1)), set(range(1, len(b) + 1))
    fixed_a, fixed_b = set(), set()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if any(code(a, i + 1, docs[0]) for i in range(i1, i2)) or any(code(b, j + 1, docs[1]) for j in range(j1, j2)):
            fixed_a.update(range(i1 + 1, i2 + 1))
            fixed_b.update(range(j1 + 1, j2 + 1))
    return fixed_a, fixed_b


def _unmatched(annotations: tuple[tuple[int, str], ...], other: str, changed: set[int]) -> list[tuple[int, str]]:
    """Annotations the other side does not say anywhere, outside the lines the diff changes."""
    flat = " ".join(other.split())
    return [(line, text) for line, text in annotations if line not in changed and text not in flat]


def row_giveaways(failing: str, repair: str) -> list[str]:
    """The row rules a (failing, repair) pair breaks. A comment or docstring may differ between
    the two only on lines the fix itself changes."""
    broken = []
    (said_failing, docs_failing), (said_repair, docs_repair) = _annotations(failing), _annotations(repair)
    fixed_failing, fixed_repair = _fixed_lines(failing, repair, (docs_failing, docs_repair))
    if _unmatched(said_failing, repair, fixed_failing) or _unmatched(said_repair, failing, fixed_repair):
        broken.append("annotation_differs")
    if repair.startswith(failing):
        return broken  # a truncated answer: what it leaves unread is cut off, not left over
    try:
        fail_unread, fail_selfs = leftovers(parse_module(failing))
        repair_read, repair_selfs = _read_names(repair)
    except SyntaxError:
        return broken  # an answer that does not parse has no names to read
    if fail_unread & repair_read:
        broken.append("dead_name")
    if fail_selfs - repair_selfs:
        broken.append("self_assignment")
    return broken


@functools.lru_cache(maxsize=64)
def _read_names(source: str) -> tuple[frozenset[str], frozenset[str]]:
    """The names a kernel reads and those it assigns to themselves. Cached: a repair is checked
    against each of its mutants."""
    tree = parse_module(source)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    return frozenset(read), frozenset(leftovers(tree)[1])


def masked_edit(failing: str, repair: str) -> str:
    """The edit from failing to repair, as its changed lines with numbers masked: two rows of
    one task with the same masked edit teach one thing twice."""
    diff = difflib.unified_diff(failing.splitlines(), repair.splitlines(), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return "\n".join(_NUMBER.sub("N", " ".join(line.split())) for line in changed)


def structure(source: str) -> str:
    """A kernel's structure: comments, docstrings, layout and names normalised away (as
    `fingerprint` does), and every number masked, so other block sizes are the same structure."""
    return _NUMBER.sub("N", canonical(source))


def dataset_giveaways(rows: list[dict], kind_of, max_share: float) -> dict[str, int]:
    """Rows over the dataset rules: how many rows sit in a kind above `max_share`, and how many
    rows repeat a (task, masked edit) beyond MAX_ROWS_PER_EDIT."""
    kinds = Counter(kind_of(r) for r in rows)
    over = sum(n - int(max_share * len(rows)) for n in kinds.values() if n > max_share * len(rows))
    edits = Counter((r["task"], masked_edit(r["failing_code"], r["repair_code"])) for r in rows)
    repeated = sum(n - MAX_ROWS_PER_EDIT for n in edits.values() if n > MAX_ROWS_PER_EDIT)
    return {"kind_over_cap": over, "repeated_edit": repeated}
