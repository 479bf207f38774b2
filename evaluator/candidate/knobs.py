"""The block-size knobs of a kernel's source, and the source rewritten with other values.

A knob is an integer the tuner (evaluator/tune.py) may change:

- a module-level constant whose name says it is a block size (`BLOCK_M = 512`, `TILE_N`,
  `BM`, `BLOCK_ROWS`, `CHUNK`), or any module-level integer constant marked on its line with
  `# tune` (`# tune: 8, 16, 32` also gives the values to try);
- an integer literal of at least 8 in the block shape of a `BlockSpec(...)` written inside a
  function (`pl.BlockSpec((256, 512), ...)`): every literal of that value in that function
  changes together, so a grid written as `n // 256` follows its block.

Values tried: powers of two that keep the knob's alignment (multiples of 128 stay multiples
of 128, of 8 stay multiples of 8) up to the largest dimension the task's cases have, plus
the current value. Whether a value is legal (tiling, VMEM, correctness) is for the
evaluator to say; this module only finds and rewrites.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from evaluator.candidate.policy import parse_module

_BLOCK_NAME = re.compile(r"^_*(block|blk|tile|chunk|b[mnkdhqv]|t[mnk])(_|\d|$)"
                         r"|_(block|blk|tile|chunk)s?(_|$)", re.IGNORECASE)
_MARK = re.compile(r"#\s*tune\b(?:\s*:\s*(?P<values>[\d,\s]+))?")
MIN_LITERAL = 8  # smaller literals in block shapes are unit dims or counts, not tile sizes


@dataclass(frozen=True)
class Knob:
    name: str  # what the table calls it: "BLOCK_M", or "256 in _matmul()"
    value: int
    kind: str  # "constant" or "literal"
    lines: tuple[int, ...]  # 1-based source lines where it is written
    choices: tuple[int, ...] = ()  # given by a `# tune: ...` mark; else derived


def find_knobs(source: str) -> list[Knob]:
    """Every knob in the source, constants first, in source order."""
    tree = parse_module(source)
    lines = source.splitlines()
    knobs = [k for k in (_constant_knob(node, lines) for node in tree.body) if k is not None]
    taken = {k.name for k in knobs}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            knobs += [k for k in _literal_knobs(func) if k.name not in taken]
    return knobs


def choices(knob: Knob, max_dim: int) -> list[int]:
    """Values to try: the mark's list, or aligned powers of two up to `max_dim`."""
    if knob.choices:
        return sorted(set(knob.choices) | {knob.value})
    align = alignment(knob)
    values = {knob.value}
    v = align
    while v <= max(max_dim, align):
        values.add(v)
        v *= 2
    return sorted(values)


def alignment(knob: Knob) -> int:
    """The tile a knob's values keep: 128 lanes if its value is a multiple of 128, else 8 rows."""
    return 128 if knob.value % 128 == 0 else 8


def rewrite(source: str, knobs: list[Knob], setting: dict[str, int]) -> str:
    """The source with each knob in `setting` (name -> value) set to its new value."""
    by_line: dict[int, list[tuple[Knob, int]]] = {}
    for knob in knobs:
        if knob.name in setting and setting[knob.name] != knob.value:
            for line in knob.lines:
                by_line.setdefault(line, []).append((knob, setting[knob.name]))
    lines = source.splitlines(keepends=True)
    for line_no, changes in by_line.items():
        text = lines[line_no - 1]
        for knob, value in changes:
            if knob.kind == "constant":
                text = re.sub(rf"^(\s*{re.escape(knob.name)}\s*(?::[^=]+)?=\s*){knob.value}\b",
                              rf"\g<1>{value}", text, count=1)
            else:
                code, sep, comment = text.partition("#")
                code = re.sub(rf"(?<![\w.]){knob.value}(?![\w.])", str(value), code)
                text = code + sep + comment
        lines[line_no - 1] = text
    return "".join(lines)


def _constant_knob(node: ast.stmt, lines: list[str]) -> Knob | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Constant)
            and type(value.value) is int):
        return None
    mark = _MARK.search(lines[node.lineno - 1])
    if mark is None and not (_BLOCK_NAME.search(target.id) and value.value >= MIN_LITERAL):
        return None
    given = ()
    if mark is not None and mark.group("values"):
        given = tuple(int(v) for v in re.findall(r"\d+", mark.group("values")))
    return Knob(target.id, value.value, "constant", (node.lineno,), given)


def _literal_knobs(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Knob]:
    """Literal ints >= MIN_LITERAL in BlockSpec block shapes directly in `func`, one knob per
    value, written wherever that value appears as a literal in the function."""
    values: set[int] = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.Call) and _called_name(node) == "BlockSpec":
            shape = node.args[0] if node.args else next(
                (kw.value for kw in node.keywords if kw.arg == "block_shape"), None)
            if isinstance(shape, (ast.Tuple, ast.List)):
                values |= {e.value for e in shape.elts if isinstance(e, ast.Constant)
                           and type(e.value) is int and e.value >= MIN_LITERAL}
    knobs = []
    for v in sorted(values):
        lines = sorted({n.lineno for n in _own_nodes(func)
                        if isinstance(n, ast.Constant) and type(n.value) is int and n.value == v})
        knobs.append(Knob(f"{v} in {func.name}()", v, "literal", tuple(lines)))
    return knobs


def _own_nodes(func: ast.AST):
    """Nodes of a function's body, not of functions nested in it (they get their own knobs)."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(ast.iter_child_nodes(node))


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
