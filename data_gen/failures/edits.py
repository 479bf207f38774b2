"""The edit engine under the bug operators: a kernel's source with its AST (`SourceModule`), the
places a bug can go (`Site`), the text edits that put it there (`Edit`), the failing kernel that
results (`Mutant`), and the record of a kind of bug (`BugOperator`).

It exists apart from the operators (data_gen/failures/operators.py) so that what a bug is and how any bug
is written into a file are separate: an edit rewrites only the source text of its site, so the
rest of the file keeps its formatting and the repair is the original kernel. Comments and
docstrings that the bug makes false (the ones on and just above the edited lines, and any that
mention what the bug contradicts) are dropped, so the failing kernel never describes the
correct code.
"""
from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from evaluator.candidate.policy import parse_module
from tasks.spec import Task

# The end of a truncated answer (operators.find_truncated_answer): a Mutant whose source ends
# with it is rendered as a fenced block left open.
TRUNCATION_MARK = "# <answer ends here>"


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (ast positions: 1-based line, 0-based column) with `text`."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str

    @property
    def deletes_lines(self) -> bool:
        return self.start[1] == 0 and self.end[1] == 0 and not self.text

    def line_delta(self) -> int:
        return self.text.count("\n") - (self.end[0] - self.start[0])


@dataclass
class Site:
    """One place an operator can inject its bug, and the facts an explanation writes about.

    `fallbacks` are the same bug at larger magnitudes, tried in order while the first survives.
    """

    edits: list[Edit]
    line: int
    facts: dict[str, str] = field(default_factory=dict)
    fallbacks: list[Site] = field(default_factory=list)
    tidy: bool = True


@dataclass(frozen=True)
class Mutant:
    task: str
    operator: str
    site: int  # index among the operator's sites in the kernel it was made from
    source: str
    line: int
    facts: dict[str, str]
    variant: str = "solution"  # the correct kernel it was made from (a variant pool entry)
    variant_key: str = ""      # that kernel's fingerprint, so ids change when the kernel does
    fallbacks: tuple[Mutant, ...] = ()  # the same bug, larger, for when this one survives
    parts: tuple[Mutant, ...] = ()      # a compound bug: the single bugs it combines

    @property
    def id(self) -> str:
        if self.variant == "solution" and not self.variant_key:
            return f"{self.task}:{self.operator}:{self.site}"
        return f"{self.task}:{self.variant}@{self.variant_key[:8]}:{self.operator}:{self.site}"

    def answer(self) -> str:
        """The mutant as a model's answer: a fenced block, left open if the answer was cut off."""
        if self.source.endswith(TRUNCATION_MARK):
            return "```python\n" + self.source[: -len(TRUNCATION_MARK)]
        return f"```python\n{self.source.rstrip()}\n```"

    @property
    def code(self) -> str:
        return self.source.removesuffix(TRUNCATION_MARK)


class SourceModule:
    """A kernel's source with its AST, parent links and which functions are kernel bodies."""

    def __init__(self, source: str, task: Task | None = None):
        self.source, self.task = source, task  # no task: a kernel read for repair, not mutation
        self.tree = parse_module(source)
        self.lines = source.splitlines(keepends=True)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.all_nodes = list(ast.walk(self.tree))
        self.comments = _comments(source)
        self.kernel_names = self._kernel_names()

    def text(self, node: ast.AST) -> str:
        """The node's source text (ast.get_source_segment, without re-splitting the file)."""
        if getattr(node, "end_lineno", None) is None:
            return ast.unparse(node)
        first, last = node.lineno - 1, node.end_lineno - 1
        lines = [line.encode() for line in self.lines[first:last + 1]]
        if first == last:
            return lines[0][node.col_offset:node.end_col_offset].decode()
        return b"".join([lines[0][node.col_offset:], *lines[1:-1], lines[-1][:node.end_col_offset]]).decode()

    def function_of(self, node: ast.AST) -> ast.FunctionDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def function_name(self, node: ast.AST) -> str:
        func = self.function_of(node)
        return func.name if func else "<module>"

    def in_kernel(self, node: ast.AST) -> bool:
        """Inside a kernel body (or a function nested in one): where TPU lowering rules apply."""
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, ast.FunctionDef) and (
                    node.name in self.kernel_names or any(a.arg.endswith("_ref") for a in node.args.args)):
                return True
        return False

    def nodes(self, kind: type | tuple[type, ...]) -> Iterator:
        return (n for n in self.all_nodes if isinstance(n, kind))

    def calls(self, dotted: str) -> Iterator[ast.Call]:
        """Calls whose callee is spelled `dotted`, e.g. 'pl.pallas_call' or 'jnp.where'."""
        return (n for n in self.nodes(ast.Call) if dotted_name(n.func) == dotted)

    def replace(self, node: ast.AST, text: str) -> Edit:
        return Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text)

    def delete_lines(self, first: int, last: int) -> Edit:
        return Edit((first, 0), (last + 1, 0), "")

    def site(self, node: ast.AST, after: str, **facts: str) -> Site:
        """A rewrite of one node's text; the facts always include function, line, before and after."""
        facts = dict(function=self.function_name(node), line=str(node.lineno), before=self.text(node),
                     after=after, **facts)
        return Site([self.replace(node, after)], node.lineno, facts)

    def apply(self, *sites: Site) -> tuple[str, list[dict[str, str]]]:
        """The source with every site's bug in it, and each site's facts with line numbers as
        they read there (and `source_line`, the text of its line)."""
        edits = [e for site in sites for e in site.edits]
        edits += [e for site in sites if site.tidy for e in self._tidy_edits(site, edits)]
        edits = _with_blank_lines_closed(self.lines, edits)

        def moved(line: int) -> int:
            return line + sum(e.line_delta() for e in edits if e.end[0] < line or (e.end[0] == line and e.end[1] == 0
                                                                                    and e.end != e.start))

        out = self._apply_edits(edits)
        new_lines = out.splitlines()
        all_facts = []
        for site in sites:
            facts = dict(site.facts)
            for key in ("line", "start"):
                if key in facts:
                    facts[key] = str(moved(int(facts[key])))
            number = int(facts.get("line", 0))
            facts["source_line"] = new_lines[number - 1].strip() if 0 < number <= len(new_lines) else ""
            all_facts.append(facts)
        return out, all_facts

    def _apply_edits(self, edits: list[Edit]) -> str:
        offsets = [0]
        for line in self.lines:
            offsets.append(offsets[-1] + len(line))

        def pos(p: tuple[int, int]) -> int:
            line, col = p
            if line > len(self.lines):
                return len(self.source)
            # ast columns are UTF-8 byte offsets
            return offsets[line - 1] + len(self.lines[line - 1].encode()[:col].decode())

        out = self.source
        for edit in sorted(edits, key=lambda e: e.start, reverse=True):
            out = out[:pos(edit.start)] + edit.text + out[pos(edit.end):]
        return out

    def _tidy_edits(self, site: Site, protected: list[Edit]) -> list[Edit]:
        """Drop the comments on the lines the bug edits: they describe the code the repair puts
        back, so they differ where the code differs and nowhere else (a comment elsewhere, or a
        docstring, stays on both sides: a difference there would be a giveaway, not a fix)."""
        edited = {line for e in site.edits for line in range(e.start[0], max(e.end[0], e.start[0]) + 1)}
        edited -= {e.end[0] for e in site.edits if e.deletes_lines}
        out = []
        for tok in self.comments:
            line, col = tok.start
            if line not in edited:
                continue
            text = self.lines[line - 1]
            if text.lstrip().startswith("#"):
                out.append(self.delete_lines(line, line))
            else:
                code = text[:col].rstrip()
                out.append(Edit((line, len(code.encode())), (line, len(text.rstrip("\n").encode())), ""))
        return [e for e in out if not any(_overlaps(e, s) for s in protected)]

    def _kernel_names(self) -> set[str]:
        """Functions passed to pl.pallas_call, directly or through functools.partial."""
        return {name for call in self.calls("pl.pallas_call") if (name := self.kernel_of(call))}

    def kernel_of(self, call: ast.Call) -> str | None:
        """The name of the kernel function a pallas_call runs, through functools.partial."""
        if not call.args:
            return None
        first = call.args[0]
        if isinstance(first, ast.Name):
            for node in self.nodes(ast.Assign):
                if (isinstance(node.value, ast.Call) and dotted_name(node.value.func) == "functools.partial"
                        and node.value.args and any(isinstance(t, ast.Name) and t.id == first.id
                                                    for t in node.targets)):
                    first = node.value.args[0]
        if isinstance(first, ast.Call) and dotted_name(first.func) == "functools.partial" and first.args:
            first = first.args[0]
        return first.id if isinstance(first, ast.Name) else None


def _comments(source: str) -> list[tokenize.TokenInfo]:
    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []


def _overlaps(a: Edit, b: Edit) -> bool:
    return a.start < b.end and b.start < a.end


def _with_blank_lines_closed(lines: list[str], edits: list[Edit]) -> list[Edit]:
    """Merge whole-line deletions, and take one blank line with each deleted block that sat
    between blank lines, so deleting code or comments never leaves a double gap."""
    deleted = {line for e in edits if e.deletes_lines for line in range(e.start[0], e.end[0])}
    others = [e for e in edits if not e.deletes_lines]
    blank = lambda n: 1 <= n <= len(lines) and not lines[n - 1].strip()  # noqa: E731
    runs: list[list[int]] = []
    for line in sorted(deleted):
        if runs and runs[-1][1] == line - 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    out = []
    for first, last in runs:
        if (blank(first - 1) or first == 1) and blank(last + 1):
            last += 1
        out.append(Edit((first, 0), (last + 1, 0), ""))
    return others + out


def dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted_name(node.value)}.{node.attr}"
    return ""


@dataclass(frozen=True)
class BugOperator:
    """A kind of bug and where it applies. What to say about it lives in data_gen/rows/explanations.py.

    `family` says how its mutants are graded and combined: "static" bugs fail before anything runs
    (lowering, VMEM) and are graded through the static stages only, "semantic" ones run and give
    wrong values or crash, "surface" ones never reach the compiler (truncation, prose in the
    code, a missing import). A compound pairs a static bug with a semantic one. Which kind of
    failure an operator injects, and how often, is the failure catalogue's business
    (data_gen/catalogue/kinds.py).
    """

    name: str
    summary: str
    find: Callable[[SourceModule], list[Site]]
    family: str = "semantic"
    parses: bool = True  # False for bugs in the answer's syntax (a truncation, prose in the code)

    @property
    def static(self) -> bool:
        """The static stages (through lowering, the VMEM budget and the estimate) show this bug or
        nothing does: its mutants are graded through them only, and one that passes them is
        dropped as survived without running its cases (a survivor costs a full grading)."""
        return self.family == "static"


# The standard imports of a Pallas kernel module, by the name each binds: what a bug may leave out
# and what a repair puts back.
STANDARD_IMPORTS = {"jnp": "import jax.numpy as jnp", "jax": "import jax", "pl": "from jax.experimental import pallas as pl",
                    "pltpu": "from jax.experimental.pallas import tpu as pltpu", "functools": "import functools",
                    "lax": "from jax import lax", "math": "import math", "np": "import numpy as np"}
