"""Repairers: mechanical fixes for failing Pallas TPU kernels, one per kind of failure.

A repairer takes a failing kernel's source and the evaluator's feedback message and returns the
source with the edits its kind is about (and nothing else), or None when it finds nothing to
change. Repairers are pure and deterministic, so a repair search can apply one, grade the
result and repeat. Sites are found on the AST; the source text is edited by position, so the
rest of the file keeps its formatting.

    REPAIRERS[kind](source, message) -> new source | None
    repair(kind, source, message="")
"""
from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from data_gen.catalogue.kinds import KINDS
from data_gen.failures.edits import STANDARD_IMPORTS, SourceModule, dotted_name
from evaluator.candidate.policy import parse_module

Repairer = Callable[[str, str], "str | None"]

# --- a small text-edit engine ---------------------------------------------------------------------


class RepairModule(SourceModule):
    """A kernel's source read for repair: the edit engine's view of it, plus the text edits a
    repairer records (by offset) and applies at the end."""

    def __init__(self, source: str):
        super().__init__(source)
        self._bytes = [line.encode() for line in self.lines]
        self.edits: list[tuple[int, int, str]] = []
        self.kernels = {f for f in self.nodes(ast.FunctionDef) if f.name in self.kernel_names
                        or any(a.arg.endswith("_ref") for a in f.args.args + f.args.kwonlyargs)}

    # positions (ast: 1-based line, 0-based utf-8 column) -> offsets in the source string
    def offset(self, line: int, col: int) -> int:
        before = sum(len(s) for s in self.lines[:line - 1])
        if line - 1 >= len(self.lines):
            return before
        return before + len(self._bytes[line - 1][:col].decode(errors="ignore"))

    def rewrite(self, node: ast.AST, text: str) -> None:
        self.edit(self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset),
                  text)

    def edit(self, start: int, end: int, text: str) -> None:
        if any(s < end and start < e or (s == e == start == end) for s, e, _ in self.edits):
            return  # overlapping edits: keep the first
        if self.source[start:end] != text:
            self.edits.append((start, end, text))

    def result(self) -> str | None:
        if not self.edits:
            return None
        out = self.source
        for start, end, text in sorted(self.edits, reverse=True):
            out = out[:start] + text + out[end:]
        return out if out != self.source else None

    def calls(self, *names: str) -> Iterator[ast.Call]:  # type: ignore[override]
        return (n for n in self.nodes(ast.Call) if dotted_name(n.func) in names)

    def kernel_of_node(self, node: ast.AST) -> ast.FunctionDef | None:
        """The outermost kernel function containing node."""
        found = None
        while node in self.parent:
            node = self.parent[node]
            if node in self.kernels:
                found = node
        return found


def parse_source(source: str) -> RepairModule | None:
    try:
        return RepairModule(source)
    except SyntaxError:
        return None


def _with_module(fn: Callable[[RepairModule, str], None]) -> Repairer:
    """A repairer from a function that records edits on the module."""

    def repairer(source: str, message: str = "") -> str | None:
        m = parse_source(source)
        if m is None:
            return None
        fn(m, message or "")
        return m.result()

    repairer.__name__ = fn.__name__
    repairer.__doc__ = fn.__doc__
    return repairer


def _delete_keyword(m: RepairModule, kw: ast.keyword) -> None:
    """Delete `kw=value,` and, when it had the line(s) to itself, the line."""
    line = m.lines[kw.lineno - 1]
    head = m._bytes[kw.lineno - 1][:kw.col_offset].decode()
    rest = m._bytes[kw.value.end_lineno - 1][kw.value.end_col_offset:].decode()
    if not head.strip() and rest.strip() in (",", ""):
        start = m.offset(kw.lineno, 0)
        end = m.offset(kw.value.end_lineno + 1, 0)
        m.edit(start, end, "")
        return
    start = m.offset(kw.lineno, kw.col_offset)
    end = m.offset(kw.value.end_lineno, kw.value.end_col_offset)
    if rest.lstrip().startswith(","):  # `kw=v, next` -> `next`
        end += len(rest) - len(rest.lstrip()) + 1
        end += len(m.source[end:]) - len(m.source[end:].lstrip(" "))
    else:  # the last argument: take the comma before it
        before = m.source[:start].rstrip()
        if before.endswith(","):
            start = len(before) - 1
    del line
    m.edit(start, end, "")


# --- block sizes: which literals feed a BlockSpec ------------------------------------------------

def _blockspec_shapes(m: RepairModule) -> Iterator[ast.AST]:
    for call in m.calls("pl.BlockSpec"):
        if call.args and not isinstance(call.args[0], ast.Lambda):
            yield call.args[0]
        elif len(call.args) >= 2 and isinstance(call.args[0], ast.Lambda):
            yield call.args[1]
        for k in call.keywords:
            if k.arg in ("block_shape", "block_size"):
                yield k.value
    for call in m.calls("pltpu.VMEM"):
        if call.args:
            yield call.args[0]


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _feeding_expressions(m: RepairModule) -> list[ast.AST]:
    """Expressions whose value flows into a block shape (name-based, scope-insensitive)."""
    shapes = list(_blockspec_shapes(m))
    names: set[str] = set()
    for s in shapes:
        names |= _names_in(s)
    functions = {f.name: f for f in m.nodes(ast.FunctionDef)}
    params: dict[str, list[tuple[str, int]]] = {}  # param name -> [(function, position)]
    for f in functions.values():
        for i, a in enumerate(f.args.posonlyargs + f.args.args):
            params.setdefault(a.arg, []).append((f.name, i))
        for a in f.args.kwonlyargs:
            params.setdefault(a.arg, []).append((f.name, -1))
    exprs: list[ast.AST] = list(shapes)
    seen_exprs: set[int] = {id(e) for e in exprs}
    calls = list(m.nodes(ast.Call))
    assigns = [a for a in m.nodes((ast.Assign, ast.AnnAssign)) if a.value is not None]

    def add(expr: ast.AST) -> bool:
        if id(expr) in seen_exprs or any(isinstance(n, ast.Lambda) for n in [expr]):
            return False
        seen_exprs.add(id(expr))
        exprs.append(expr)
        new = _names_in(expr) - names
        names.update(new)
        return True

    changed = True
    while changed:
        changed = False
        for a in assigns:
            targets = a.targets if isinstance(a, ast.Assign) else [a.target]
            if any(_names_in(t) & names for t in targets if isinstance(t, (ast.Name, ast.Tuple))):
                changed |= add(a.value)
        for name in list(names):
            f = functions.get(name)
            if f is not None and f not in m.kernels:
                for r in ast.walk(f):
                    if isinstance(r, ast.Return) and r.value is not None:
                        changed |= add(r.value)
                for call in calls:
                    if dotted_name(call.func) == name:
                        for arg in call.args:
                            changed |= add(arg)
                        for k in call.keywords:
                            changed |= add(k.value)
                for d in f.args.defaults + [d for d in f.args.kw_defaults if d is not None]:
                    changed |= add(d)
            for fname, pos in params.get(name, []):
                f = functions[fname]
                for call in calls:
                    callee = dotted_name(call.func).split(".")[-1]
                    if callee != fname:
                        continue
                    for k in call.keywords:
                        if k.arg == name:
                            changed |= add(k.value)
                    if 0 <= pos < len(call.args) and not isinstance(call.args[pos], ast.Starred):
                        changed |= add(call.args[pos])
                args = f.args
                all_pos = args.posonlyargs + args.args
                for i, d in enumerate(args.defaults):
                    if all_pos[len(all_pos) - len(args.defaults) + i].arg == name:
                        changed |= add(d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults):
                    if a.arg == name and d is not None:
                        changed |= add(d)
    return exprs


def _block_literals(m: RepairModule) -> list[tuple[ast.Constant, bool]]:
    """Int literals used as block sizes, each with whether it is the last dim of a shape tuple."""
    shapes = {id(s) for s in _blockspec_shapes(m)}
    out, seen = [], set()
    for expr in _feeding_expressions(m):
        for node in ast.walk(expr):
            if not (isinstance(node, ast.Constant) and type(node.value) is int) or id(node) in seen:
                continue
            parent = m.parent.get(node)
            if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Compare, ast.Slice)):
                continue
            if any(isinstance(a, ast.Lambda) for a in _ancestors(m, node, expr)):
                continue
            seen.add(id(node))
            last = isinstance(parent, ast.Tuple) and id(parent) in shapes and parent.elts[-1] is node
            out.append((node, last))
    return out


def _ancestors(m: RepairModule, node: ast.AST, stop: ast.AST) -> Iterator[ast.AST]:
    while node is not stop and node in m.parent:
        node = m.parent[node]
        yield node


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# Mosaic's refusal names the block and the array: "block shape (Blocked(block_size=256),
# Blocked(block_size=2000)), array shape (4096, 393216)".
_REFUSED_BLOCK = re.compile(r"block shape \(([^()]*(?:\([^()]*\)[^()]*)*)\), array shape \(([\d, ]+)\)")


def refused_block(message: str) -> tuple[list[int], list[int]] | None:
    """(block sizes, array shape) of the block Mosaic's refusal names, when it names one of the
    array's rank (at least 2)."""
    found = _REFUSED_BLOCK.search(message)
    if not found:
        return None
    block = [int(v) for v in re.findall(r"block_size=(\d+)", found.group(1))]
    array = [int(v) for v in found.group(2).replace(" ", "").split(",") if v]
    return (block, array) if len(block) >= 2 and len(block) == len(array) else None


def _misaligned_sizes(message: str) -> dict[int, int]:
    """From a refusal message, each block size that breaks the (8, 128) rule, with the multiple
    it rounds up to: the last dim to 128, the one before to 8 (sizes under 8 stay: a block of
    one row is a layout, not a typo)."""
    refused = refused_block(message)
    if refused is None:
        return {}
    block, array = refused
    sizes = {}
    if block[-1] % 128 and block[-1] != array[-1]:
        sizes[block[-1]] = _round_up(block[-1], 128)
    if block[-2] % 8 and block[-2] != array[-2] and block[-2] >= 8:
        sizes[block[-2]] = _round_up(block[-2], 8)
    return sizes


def row_block_refused(message: str) -> bool:
    """Mosaic refused a block of one row (second-minor size 1) of an array with more rows."""
    refused = refused_block(message)
    return refused is not None and refused[0][-2] == 1 and refused[1][-2] > 1


ROWS_PER_BLOCK = 8  # the f32 sublane count: the smallest legal block of rows
# Reductions a row kernel applies to its row: with ROWS_PER_BLOCK rows each must reduce along the row.
_ROW_REDUCTIONS = ("jnp.sum", "jnp.mean", "jnp.max", "jnp.min", "jnp.var", "jnp.std", "jnp.prod", "jnp.linalg.norm",
                   "jax.nn.logsumexp", "jax.scipy.special.logsumexp")


def _assigned_tuple(m: RepairModule, node: ast.AST) -> ast.AST:
    """A name bound once to a tuple, as that tuple; anything else as itself."""
    if not isinstance(node, ast.Name):
        return node
    values = [a.value for a in m.nodes(ast.Assign)
              if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == node.id]
    return values[0] if len(values) == 1 and isinstance(values[0], ast.Tuple) else node


def _row_walk(call: ast.Call) -> tuple[ast.AST, int] | None:
    """(block shape, grid axis) of a BlockSpec whose index map puts a grid index on its rows."""
    shape = call.args[0] if call.args and not isinstance(call.args[0], ast.Lambda) else next(
        (k.value for k in call.keywords if k.arg in ("block_shape", "block_size")), None)
    index_map = next((a for a in call.args if isinstance(a, ast.Lambda)),
                     next((k.value for k in call.keywords if k.arg == "index_map"), None))
    if shape is None or not isinstance(index_map, ast.Lambda) or not isinstance(index_map.body, ast.Tuple):
        return None
    first, params = index_map.body.elts[0], [a.arg for a in index_map.args.args]
    if len(index_map.body.elts) != 2 or not isinstance(first, ast.Name) or first.id not in params:
        return None
    return shape, params.index(first.id)


def _repair_row_blocks(m: RepairModule) -> None:
    """Blocks of one row, (1, D), become blocks of ROWS_PER_BLOCK rows: the block, the grid
    axis that walks the rows (cdiv), and the row kernels (`ref[0, :]` -> `ref[...]`, each
    reduction along the row with its dim kept)."""
    axes = set()
    specs = list(m.calls("pl.BlockSpec"))
    for call in specs:
        walk = _row_walk(call)
        if walk is None:
            continue
        shape = _assigned_tuple(m, walk[0])
        if not (isinstance(shape, ast.Tuple) and len(shape.elts) == 2 and _int_value(shape.elts[0]) == 1):
            continue
        axes.add(walk[1])
        shared = isinstance(walk[0], ast.Name) and any(
            _row_walk(other) is None for other in specs
            if other.args and isinstance(other.args[0], ast.Name) and other.args[0].id == walk[0].id)
        if shared:  # a name that also shapes a block not walking the rows (a (1, D) weight): spell it out here
            m.rewrite(walk[0], f"({ROWS_PER_BLOCK}, {m.text(shape.elts[1])})")
        else:
            m.rewrite(shape.elts[0], str(ROWS_PER_BLOCK))
    if not axes:
        return
    for grid in (k.value for c in m.nodes(ast.Call) for k in c.keywords if k.arg == "grid"):
        grid = _assigned_tuple(m, grid)
        for axis in axes:
            if isinstance(grid, ast.Tuple) and axis < len(grid.elts):
                m.rewrite(grid.elts[axis], f"pl.cdiv({m.text(grid.elts[axis])}, {ROWS_PER_BLOCK})")
    for kernel in m.kernels:
        refs = {a.arg for a in kernel.args.args}
        for sub in (n for n in ast.walk(kernel) if isinstance(n, ast.Subscript)):
            index = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            rest_whole = all(isinstance(e, ast.Slice) and e.lower is e.upper is e.step is None
                             or isinstance(e, ast.Constant) and e.value is Ellipsis for e in index[1:])
            if (isinstance(sub.value, ast.Name) and sub.value.id in refs and _int_value(index[0]) == 0
                    and rest_whole):
                m.rewrite(sub, f"{sub.value.id}[...]")
        for call in (n for n in ast.walk(kernel) if isinstance(n, ast.Call)):
            if dotted_name(call.func) in _ROW_REDUCTIONS and call.args:
                _reduce_along_rows(m, call)


def _reduce_along_rows(m: RepairModule, call: ast.Call) -> None:
    """`jnp.sum(x)` / `jnp.sum(x, axis=0)` -> `jnp.sum(x, axis=-1, keepdims=True)`, editing only
    the axis and keepdims arguments (the operand may hold edits of its own)."""
    wanted = {"axis": "-1", "keepdims": "True"}
    given = {k.arg: k.value for k in call.keywords if k.arg in wanted}
    if len(call.args) > 1:
        given.setdefault("axis", call.args[1])
    for name, value in given.items():
        m.rewrite(value, wanted[name])
    missing = [f"{name}={value}" for name, value in wanted.items() if name not in given]
    if missing:
        _append_argument(m, call, ", ".join(missing))


@_with_module
def repair_block_alignment(m: RepairModule, message: str) -> None:
    """Round block-size literals that are not multiples of (8, 128) up to a multiple of 128;
    with Mosaic's refusal, the sizes it names, wherever such a literal feeds a block shape, and
    a block of one row becomes a block of eight (_repair_row_blocks)."""
    if row_block_refused(message):
        _repair_row_blocks(m)
        return
    named = _misaligned_sizes(message)
    for node, last in _block_literals(m):
        v = node.value
        if v in named:
            m.rewrite(node, str(named[v]))
        elif v >= 16 and (v % 8 or (last and v % 128)):
            m.rewrite(node, str(_round_up(v, 128)))


# Our VMEM refusal: "needs at least 48.0 MiB of VMEM ... over the default scoped VMEM limit of 32 MiB
# on v6e", or "... over vmem_limit_bytes=62914560 (physical 128 MiB)" when the kernel set a limit.
OVER_LIMIT = re.compile(r"needs at least ([\d.]+) MiB of VMEM.*over (?:the default scoped VMEM limit of [\d.]+ MiB "
                         r"on (\w+)|vmem_limit_bytes=\d+ \(physical (\d+) MiB\))", re.S)
VMEM_HEADROOM = 1.25  # the limit asked for, over the bytes the blocks need: the compiler's own scratch


def _raise_scoped_limit(m: RepairModule, message: str) -> bool:
    """Blocks over the scoped VMEM limit that fit the chip: ask for a limit that holds them, in
    whole MiB, when it stays within three quarters of the chip's VMEM: the kernel's own
    `vmem_limit_bytes` raised, or `compiler_params=pltpu.CompilerParams(vmem_limit_bytes=...)`."""
    from evaluator.performance.hardware import GENERATIONS, MiB

    found = OVER_LIMIT.search(message)
    if found is None:
        return False
    generation = GENERATIONS.get(found.group(2) or "")
    physical = generation.vmem_bytes if generation else int(found.group(3) or 0) * MiB
    limit = math.ceil(float(found.group(1)) * VMEM_HEADROOM) * MiB
    calls = list(m.calls("pl.pallas_call"))
    if not calls or limit > 0.75 * physical:
        return False
    own = [k.value for c in m.nodes(ast.Call) for k in c.keywords if k.arg == "vmem_limit_bytes"]
    for value in own:
        m.rewrite(value, str(limit))
    if own:
        return True
    for call in calls:
        params = next((k.value for k in call.keywords if k.arg == "compiler_params"), None)
        if isinstance(params, ast.Call):
            _append_argument(m, params, f"vmem_limit_bytes={limit}")
        elif params is None:
            _append_argument(m, call, f"compiler_params=pltpu.CompilerParams(vmem_limit_bytes={limit})")
    return True


def _append_argument(m: RepairModule, call: ast.Call, text: str) -> None:
    """Add `text` as the call's last argument, right after the current last one (a trailing
    comma and the closing parenthesis stay where they are)."""
    last = max([*call.args, *(k.value for k in call.keywords)], key=lambda n: (n.end_lineno, n.end_col_offset),
               default=None)
    if last is None:
        end = m.offset(call.end_lineno, call.end_col_offset) - 1
        m.edit(end, end, text)
        return
    end = m.offset(last.end_lineno, last.end_col_offset)
    m.edit(end, end, f", {text}")


@_with_module
def repair_vmem_exhaustion(m: RepairModule, message: str) -> None:
    """Blocks over the default scoped VMEM limit that fit the chip: raise the limit. Otherwise
    halve the largest block-size literal (>= 256) feeding a BlockSpec. Any kernel with blocks
    has one, so with a message, only when it is about memory."""
    if message and not re.search(r"vmem|memory|exhaust|alloc|out of|too large", message, re.I):
        return
    if _raise_scoped_limit(m, message):
        return
    for call in m.calls("pl.pallas_call"):
        if not any(k.arg in ("grid", "grid_spec") for k in call.keywords):
            return  # whole arrays as single blocks: no block size to shrink
    candidates = [n for n, _ in _block_literals(m) if n.value >= 256 and n.value % 8 == 0]
    if not candidates:
        return
    top = max(n.value for n in candidates)
    for n in candidates:
        if n.value == top:
            m.rewrite(n, str(top // 2))


# --- traced values in Python control flow ---------------------------------------------------------

_TRACED_CALLS = ("pl.program_id", "pl.num_programs")


def _static_names(m: RepairModule, func: ast.FunctionDef) -> set[str]:
    """Names in a kernel that are Python values at trace time: module constants, the kernel's
    non-ref parameters (bound by functools.partial) and locals computed only from those."""
    static = {t.id for a in m.tree.body if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)}
    static |= {f.name for f in m.tree.body if isinstance(f, (ast.FunctionDef, ast.ClassDef))}
    static |= {"range", "len", "min", "max", "int", "float", "bool", "abs", "enumerate", "zip", "divmod", "round"}
    static |= {a.asname or a.name.split(".")[0] for i in m.tree.body if isinstance(i, (ast.Import, ast.ImportFrom))
               for a in i.names}
    args = func.args
    static |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if not a.arg.endswith("_ref")}
    static |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for _ in range(3):
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_static(node.value, static):
                static |= {n.id for n in ast.walk(node.targets[0]) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.For) and _is_static(node.iter, static):
                static |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.For):
                static |= _static_loop_names(node, static)
    return static


def _static_loop_names(loop: ast.For, static: set[str]) -> set[str]:
    """`for w_ref, out_ref, rotate in ((wq_ref, q_ref, True), ...)`: the target names whose
    value is static in every row of a literal table, though other columns hold refs."""
    rows, target = loop.iter, loop.target
    if not (isinstance(rows, (ast.Tuple, ast.List)) and isinstance(target, ast.Tuple) and rows.elts
            and all(isinstance(r, ast.Tuple) and len(r.elts) == len(target.elts) for r in rows.elts)):
        return set()
    return {t.id for i, t in enumerate(target.elts) if isinstance(t, ast.Name)
            and all(_is_static(r.elts[i], static) for r in rows.elts)}


def _is_static(expr: ast.AST, static: set[str]) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and (dotted_name(n.func) in _TRACED_CALLS or dotted_name(n.func).startswith(("jnp.", "lax."))):
            return False
        if isinstance(n, ast.Subscript) and dotted_name(n.value).endswith("_ref"):
            return False
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim", "dtype", "size"):
            continue
        if isinstance(n, ast.Name) and n.id not in static and not _under_shape(n, expr):
            return False
    return True


def _under_shape(name: ast.Name, expr: ast.AST) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim", "dtype", "size") and n.value is name:
            return True
    return False


def _traced(m: RepairModule, expr: ast.AST) -> bool:
    func = m.kernel_of_node(expr)
    if func is None:
        return False
    inner = m.function_of(expr)
    static = _static_names(m, func)
    if inner is not None and inner is not func:  # a nested function's parameters are traced (loop bodies)
        static -= {a.arg for a in inner.args.args}
    return not _is_static(expr, static)


@_with_module
def repair_traced_bool(m: RepairModule, message: str) -> None:
    """`a if c else b` -> `jnp.where(c, a, b)`; `if c:` on a traced value -> a `@pl.when(c)` function."""
    for node in m.nodes(ast.IfExp):
        if m.in_kernel(node) and _traced(m, node.test):
            m.rewrite(node, f"jnp.where({m.text(node.test)}, {m.text(node.body)}, {m.text(node.orelse)})")
    for node in m.nodes(ast.If):
        if node.orelse or not m.in_kernel(node) or not _traced(m, node.test):
            continue
        if node.body[0].lineno == node.lineno or any(isinstance(n, (ast.Return, ast.Nonlocal, ast.Global))
                                                      for s in node.body for n in ast.walk(s)):
            continue
        indent = m.lines[node.lineno - 1][:len(m.lines[node.lineno - 1]) - len(m.lines[node.lineno - 1].lstrip())]
        start = m.offset(node.lineno, 0)
        end = m.offset(node.body[0].lineno, 0)
        header = f"{indent}@pl.when({m.text(node.test)})\n{indent}def _when_{node.lineno}():\n"
        m.edit(start, end, header)


# --- traced slice bounds --------------------------------------------------------------------------

def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _slice_size(m: RepairModule, lo: ast.AST, hi: ast.AST) -> str | None:
    """The size of lo:hi when it simplifies to an expression free of lo's traced part."""
    # a:a + n  /  a:n + a
    if isinstance(hi, ast.BinOp) and isinstance(hi.op, ast.Add):
        if _same(hi.left, lo):
            return m.text(hi.right)
        if _same(hi.right, lo):
            return m.text(hi.left)
    # i * n:(i + 1) * n  and  n * i:n * (i + 1)
    if (isinstance(lo, ast.BinOp) and isinstance(lo.op, ast.Mult) and isinstance(hi, ast.BinOp)
            and isinstance(hi.op, ast.Mult)):
        for li, ln, hi_i, hn in ((lo.left, lo.right, hi.left, hi.right), (lo.right, lo.left, hi.right, hi.left),
                                 (lo.left, lo.right, hi.right, hi.left), (lo.right, lo.left, hi.left, hi.right)):
            if (_same(ln, hn) and isinstance(hi_i, ast.BinOp) and isinstance(hi_i.op, ast.Add)
                    and _same(hi_i.left, li) and isinstance(hi_i.right, ast.Constant) and hi_i.right.value == 1):
                return m.text(ln)
    return None


@_with_module
def repair_traced_index(m: RepairModule, message: str) -> None:
    """`x_ref[a:a + n]`, `x_ref[i * n:(i + 1) * n]` with traced bounds -> `x_ref[pl.ds(a, n)]`;
    a block loaded whole and then sliced, `x_ref[...][a:a + n]`, reads the window from the ref."""
    for sub in m.nodes(ast.Subscript):
        loaded = sub.value
        if (isinstance(loaded, ast.Subscript) and isinstance(loaded.slice, ast.Constant)
                and loaded.slice.value is Ellipsis and dotted_name(loaded.value).endswith("_ref")):
            m.rewrite(loaded, m.text(loaded.value))  # x_ref[...][window] -> x_ref[window]
        elif not dotted_name(loaded).endswith("_ref"):
            continue
        if not m.in_kernel(sub):
            continue
        parts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        for s in parts:
            if not (isinstance(s, ast.Slice) and s.lower is not None and s.upper is not None and s.step is None):
                continue
            if not (_traced(m, s.lower) or _traced(m, s.upper)):
                continue
            size = _slice_size(m, s.lower, s.upper)
            if size is not None:
                m.rewrite(s, f"pl.ds({m.text(s.lower)}, {size})")


# --- ops Mosaic cannot lower ----------------------------------------------------------------------

def _axis(call: ast.Call) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == "axis":
            return k.value
    return call.args[1] if len(call.args) >= 2 else None


def _int_value(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return None


@_with_module
def repair_unsupported_op(m: RepairModule, message: str) -> None:
    """`jnp.cumsum(x, axis=A)[..., -1:]` -> `jnp.sum(x, axis=A, keepdims=True)` (sort/max likewise);
    any other cumsum in a kernel -> a blocked scan (_scan_in_kernels)."""
    for sub in m.nodes(ast.Subscript):
        call = sub.value
        if not (isinstance(call, ast.Call) and dotted_name(call.func) in ("jnp.cumsum", "jnp.sort") and call.args):
            continue
        if any(k.arg not in ("axis",) for k in call.keywords):
            continue
        elts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        last = elts[-1]
        if not (isinstance(last, ast.Slice) and _int_value(last.lower) == -1 and last.upper is None
                and last.step is None):
            continue
        if not all(isinstance(e, ast.Constant) and e.value is Ellipsis
                   or isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None
                   for e in elts[:-1]):
            continue
        axis = _axis(call)
        ax = _int_value(axis) if axis is not None else None
        has_ellipsis = any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts[:-1])
        if axis is None or not (ax == -1 or (not has_ellipsis and ax == len(elts) - 1)):
            continue
        name = "jnp.sum" if dotted_name(call.func) == "jnp.cumsum" else "jnp.max"
        m.rewrite(sub, f"{name}({m.text(call.args[0])}, axis={m.text(axis)}, keepdims=True)")
    _scan_in_kernels(m)


_FLIPS = ("jnp.flip", "jax.numpy.flip")


def _scan_in_kernels(m: RepairModule) -> None:
    """`jnp.cumsum(x, axis=A)` in a kernel -> `_verified_cumsum(x, axis=A)`, a blocked scan Mosaic
    lowers (data_gen/repairs/kernel_ops.py, its code appended once); the reversed sum
    `jnp.flip(jnp.cumsum(jnp.flip(x, axis=A), axis=A), axis=A)` -> `reverse=True`."""
    from data_gen.repairs import kernel_ops

    if "def _verified_cumsum" in m.source:
        return
    before = len(m.edits)
    for call in m.calls(*_FLIPS):
        scan = call.args[0] if call.args else None
        if not (m.in_kernel(call) and isinstance(scan, ast.Call) and dotted_name(scan.func) in kernel_ops.STAND_INS
                and scan.args and isinstance(scan.args[0], ast.Call) and dotted_name(scan.args[0].func) in _FLIPS
                and scan.args[0].args):
            continue
        axes = {ast.dump(a) if a is not None else None for a in (_axis(call), _axis(scan), _axis(scan.args[0]))}
        if len(axes) == 1 and None not in axes:
            m.rewrite(call, f"_verified_cumsum({m.text(scan.args[0].args[0])}, axis={m.text(_axis(call))}, "
                            "reverse=True)")
    for call in m.calls(*kernel_ops.STAND_INS):
        if m.in_kernel(call):
            m.rewrite(call.func, kernel_ops.STAND_INS[dotted_name(call.func)])
    if len(m.edits) > before:
        _append_stand_ins(m, "A verified stand-in for jnp.cumsum that Mosaic lowers (a blocked scan on the MXU)",
                          kernel_ops)


# --- Pallas API spelling --------------------------------------------------------------------------

KWARG_FIXES = {"out_shapes": "out_shape", "input_specs": "in_specs", "output_specs": "out_specs",
               "scratch": "scratch_shapes", "grid_size": "grid", "compiler_param": "compiler_params",
               "dimension_semantic": "dimension_semantics", "block_size": "block_shape", "index_fn": "index_map",
               "gridspec": "grid_spec", "num_prefetch": "num_scalar_prefetch"}
_KWARG_OWNERS = ("pl.pallas_call", "pl.BlockSpec", "pltpu.CompilerParams", "pltpu.TPUCompilerParams",
                 "pltpu.PrefetchScalarGridSpec")
_FAKE_TPU_MODULES = ("tpu_ops", "mosaic_tpu", "tpu_primitives")


@_with_module
def repair_api_misuse(m: RepairModule, message: str) -> None:
    """Misspelled Pallas keywords, renamed APIs, invented modules and the old BlockSpec order."""
    for call in m.calls(*_KWARG_OWNERS):
        for kw in call.keywords:
            if kw.arg in KWARG_FIXES:
                start = m.offset(kw.lineno, kw.col_offset)
                m.edit(start, start + len(kw.arg), KWARG_FIXES[kw.arg])
    for node in m.nodes(ast.Attribute):
        name = dotted_name(node)
        if name == "pltpu.TPUCompilerParams":
            m.rewrite(node, "pltpu.CompilerParams")
        elif name == "pltpu.TPUMemorySpace.ANY":
            m.rewrite(node, "pl.ANY")  # this JAX has no pltpu.ANY
    for node in m.nodes(ast.ImportFrom):
        if node.module == "jax.experimental.pallas":
            for alias in node.names:
                if alias.name in _FAKE_TPU_MODULES:
                    text = m.text(node)
                    new = re.sub(rf"\b{alias.name}\b", "tpu", text, count=1)
                    m.rewrite(node, new)
    for call in m.calls("pl.BlockSpec"):
        if len(call.args) == 2 and isinstance(call.args[0], ast.Lambda) and not isinstance(call.args[1], ast.Lambda):
            first, second = m.text(call.args[0]), m.text(call.args[1])
            m.rewrite(call.args[0], second)
            m.rewrite(call.args[1], first)
    for call in m.calls("pl.when"):  # pl.when(cond, body): the decorator called as a function
        if len(call.args) == 2 and not call.keywords:
            m.rewrite(call, f"pl.when({m.text(call.args[0])})({m.text(call.args[1])})")
    for call in m.calls("pltpu.repeat"):
        _tile(m, call)


def _tile(m: RepairModule, call: ast.Call) -> None:
    """`pltpu.repeat(x, n, axis)`, which this JAX lacks, as what it computed: n copies of x side
    by side along the axis; `pltpu.repeat(x, (r0, r1))` as `jnp.tile(x, (r0, r1))`."""
    axis = next((k.value for k in call.keywords if k.arg == "axis"), call.args[2] if len(call.args) > 2 else None)
    if len(call.args) < 2 or _int_value(call.args[1]) == 0:
        return
    x, reps = m.text(call.args[0]), call.args[1]
    if isinstance(reps, ast.Tuple) and axis is None:
        m.rewrite(call, f"jnp.tile({x}, {m.text(reps)})")
    elif axis is not None and not isinstance(reps, ast.Tuple):
        m.rewrite(call, f"jnp.concatenate([{x}] * {m.text(reps)}, axis={m.text(axis)})")


# --- constants captured by a kernel ---------------------------------------------------------------

_ARRAY_CTORS = ("jnp.asarray", "jnp.array", "jnp.float32", "jnp.bfloat16", "jnp.float16", "jnp.int32",
                "jax.numpy.asarray", "jax.numpy.array")


def _python_scalar(m: RepairModule, node: ast.AST) -> str | None:
    """The Python expression inside `jnp.float32(expr)` / `jnp.asarray(expr, dtype)`, when it
    uses no jax itself (a literal, a name, `head_dim ** -0.5`)."""
    if not (isinstance(node, ast.Call) and dotted_name(node.func) in _ARRAY_CTORS and 1 <= len(node.args) <= 2):
        return None
    value = node.args[0]
    if any(isinstance(n, ast.Name) and n.id in ("jnp", "jax", "lax", "np") for n in ast.walk(value)):
        return None
    return m.text(value)


@_with_module
def repair_captured_constant(m: RepairModule, message: str) -> None:
    """`partial(kernel, eps=jnp.asarray(1e-6, jnp.float32))` -> `eps=1e-6` (and module constants a
    kernel reads)."""
    kernel_names = {f.name for f in m.kernels}
    for call in m.calls("functools.partial", "partial"):
        if not call.args or dotted_name(call.args[0]).split(".")[-1] not in kernel_names:
            continue
        for kw in call.keywords:
            scalar = _python_scalar(m, kw.value)
            if scalar is not None:
                m.rewrite(kw.value, scalar)
    used = {n.id for f in m.kernels for n in ast.walk(f) if isinstance(n, ast.Name)}
    for node in m.tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in used):
            scalar = _python_scalar(m, node.value)
            if scalar is not None:
                m.rewrite(node.value, scalar)


# --- stores that do not match their ref -----------------------------------------------------------

_REDUCTIONS = ("jnp.sum", "jnp.max", "jnp.min", "jnp.mean")


def _ref_block_shape(m: RepairModule, ref: str, kernel: ast.FunctionDef) -> ast.Tuple | None:
    """The block shape of the BlockSpec that feeds `ref` (in_specs then out_specs, in order)."""
    params = [a.arg for a in kernel.args.posonlyargs + kernel.args.args]
    if ref not in params:
        return None
    index = params.index(ref)
    for call in m.calls("pl.pallas_call"):
        if m.kernel_of(call) != kernel.name:
            continue
        specs: list[ast.AST] = []
        for name in ("in_specs", "out_specs"):
            kw = next((k for k in call.keywords if k.arg == name), None)
            if kw is None:
                return None
            value = kw.value
            specs += list(value.elts) if isinstance(value, (ast.List, ast.Tuple)) else [value]
        if index < len(specs):
            spec = specs[index]
            if isinstance(spec, ast.Name):
                spec = next((a.value for a in m.nodes(ast.Assign) if any(
                    isinstance(t, ast.Name) and t.id == spec.id for t in a.targets)), spec)
            if isinstance(spec, ast.Call) and spec.args and isinstance(spec.args[0], ast.Tuple):
                return spec.args[0]
    return None


@_with_module
def repair_ref_store_mismatch(m: RepairModule, message: str) -> None:
    """bfloat16 scratch or matmul results that receive float32 -> float32; a scalar store of a
    reduction -> a keepdims reduction stored to the whole ref. The dtype half needs a message about
    dtypes: a bfloat16 scratch that is only ever stored bfloat16 (mamba2_ssd's C) is correct."""
    if re.search(r"dtype|swap|bfloat16|bf16", message, re.I):
        for call in m.calls("pltpu.VMEM"):
            if len(call.args) == 2 and dotted_name(call.args[1]) == "jnp.bfloat16":
                m.rewrite(call.args[1], "jnp.float32")
        for kw in m.nodes(ast.keyword):
            if kw.arg == "preferred_element_type" and dotted_name(kw.value) == "jnp.bfloat16":
                m.rewrite(kw.value, "jnp.float32")
    for node in m.nodes(ast.Assign):
        target = node.targets[0]
        if not (len(node.targets) == 1 and isinstance(target, ast.Subscript) and dotted_name(target.value).endswith("_ref")
                and m.in_kernel(node)):
            continue
        idx = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
        if not all(_int_value(i) is not None for i in idx):
            continue
        reductions = [c for c in ast.walk(node.value) if isinstance(c, ast.Call) and dotted_name(c.func) in _REDUCTIONS
                      and not any(k.arg == "keepdims" for k in c.keywords) and len(c.args) == 1]
        if not reductions:
            continue
        kernel = m.kernel_of_node(node)
        shape = _ref_block_shape(m, dotted_name(target.value), kernel) if kernel is not None else None
        axis_kw = ""
        if shape is not None and len(shape.elts) >= 2 and _int_value(shape.elts[-1]) == 1 and not all(
                _int_value(e) == 1 for e in shape.elts):
            axis_kw = "axis=-1, "
        m.rewrite(target, f"{m.text(target.value)}[...]")
        for c in reductions:
            has_axis = any(k.arg == "axis" for k in c.keywords)
            extra = ("" if has_axis else axis_kw) + "keepdims=True"
            args = ", ".join([m.text(c.args[0])] + [m.text(k) for k in c.keywords] + [extra])
            m.rewrite(c, f"{dotted_name(c.func)}({args})")


# --- shapes ---------------------------------------------------------------------------------------

def _broadcast_operand(m: RepairModule, call: ast.Call) -> bool:
    """Whether the reduction's result meets a block in arithmetic: directly, or through a name."""
    parent = m.parent.get(call)
    if isinstance(parent, ast.BinOp):
        other = parent.right if parent.left is call else parent.left
        return not isinstance(other, ast.Constant)
    if isinstance(parent, ast.Call) and dotted_name(parent.func) in ("jnp.maximum", "jnp.minimum", "jnp.where"):
        return True
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
        func = m.function_of(call)
        if func is None:
            return False
        for n in ast.walk(func):
            if isinstance(n, ast.BinOp) and n.lineno > parent.lineno:
                for side, other in ((n.left, n.right), (n.right, n.left)):
                    if isinstance(side, ast.Name) and side.id == name and not isinstance(other, ast.Constant):
                        return True
    return False


@_with_module
def repair_shape_error(m: RepairModule, message: str) -> None:
    """Reductions broadcast against the block get keepdims=True; `.T` on a dot operand is removed
    when the message is about contracting dimensions."""
    for call in m.calls(*_REDUCTIONS):
        if not m.in_kernel(call) or any(k.arg == "keepdims" for k in call.keywords) or len(call.args) != 1:
            continue
        axis = _int_value(_axis(call))
        if axis not in (-1, 1) or not _broadcast_operand(m, call):
            continue
        end = m.offset(call.end_lineno, call.end_col_offset) - 1  # the closing parenthesis
        inner = m.source[:end].rstrip()
        sep = " " if inner.endswith(",") else ", "
        m.edit(end, end, f"{sep}keepdims=True")
    if re.search(r"contracting dimensions|dot_general", message):
        for call in m.calls("jnp.dot", "lax.dot", "jax.lax.dot", "jnp.matmul"):
            for arg in call.args[:2]:
                if isinstance(arg, ast.Attribute) and arg.attr == "T":
                    m.rewrite(arg, m.text(arg.value))


# --- Triton-only primitives -----------------------------------------------------------------------

@_with_module
def repair_triton_primitive(m: RepairModule, message: str) -> None:
    """`pl.broadcast_to` -> `jnp.broadcast_to`; `pl.dot(a, b)` -> `jnp.dot(a, b, f32 result)`."""
    for call in m.calls("pl.broadcast_to"):
        m.rewrite(call.func, "jnp.broadcast_to")
    for call in m.calls("pl.dot"):
        if len(call.args) != 2:
            continue
        a, b = (m.text(x) for x in call.args)
        kws = {k.arg: k.value for k in call.keywords}
        if set(kws) - {"trans_a", "trans_b", "preferred_element_type"}:
            continue
        for key, name in (("trans_a", "a"), ("trans_b", "b")):
            if key in kws:
                if not isinstance(kws[key], ast.Constant):
                    break
                if kws[key].value:
                    if name == "a":
                        a = f"{a}.T"
                    else:
                        b = f"{b}.T"
        else:
            pet = m.text(kws["preferred_element_type"]) if "preferred_element_type" in kws else "jnp.float32"
            m.rewrite(call, f"jnp.dot({a}, {b}, preferred_element_type={pet})")


# --- BlockSpec rank -------------------------------------------------------------------------------

_RANK = re.compile(r"Block shape for (args|outputs)((?:\[\d+\])*) \(= .*?\) must have the same number "
                   r"of dimensions as the array shape \(([^)]*)\)", re.S)


def _spec_list(m: RepairModule, call: ast.Call, key: str) -> list[ast.AST] | None:
    """The `in_specs` / `out_specs` of a pallas_call, given to it or to its `grid_spec`."""
    owners = [call] + [k.value for k in call.keywords if k.arg == "grid_spec" and isinstance(k.value, ast.Call)]
    kw = next((k for owner in owners for k in owner.keywords if k.arg == key), None)
    if kw is None:
        return None
    value = kw.value
    return list(value.elts) if isinstance(value, (ast.List, ast.Tuple)) else [value]


def _resolve_spec(m: RepairModule, spec: ast.AST) -> ast.Call | None:
    if isinstance(spec, ast.Name):
        found = [a.value for a in m.nodes(ast.Assign)
                 if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == spec.id]
        spec = found[0] if len(found) == 1 else None
    if isinstance(spec, ast.Call) and dotted_name(spec.func) == "pl.BlockSpec":
        return spec
    return None


def _short_by_one(shape: ast.AST, index_map: ast.AST) -> bool:
    """A block shape tuple one dim shorter than what its index map (a lambda) returns."""
    return (isinstance(shape, ast.Tuple) and isinstance(index_map, ast.Lambda)
            and isinstance(index_map.body, ast.Tuple) and len(index_map.body.elts) == len(shape.elts) + 1)


def repair_block_rank(source: str, message: str = "") -> str | None:
    """Prepend a squeezed (None) dim to the BlockSpec the message names, and the first grid
    parameter its index map leaves unused to its results; where the index map already returns
    one index per array dim, prepend the dim only (to every block so short)."""
    m = parse_source(source)
    found = _RANK.search(message or "")
    if m is None or not found:
        return None
    side, path, array = found.groups()
    rank = len([d for d in array.split(",") if d.strip()])
    index = int(re.findall(r"\d+", path)[0]) if path else 0
    specs = []
    for call in m.calls("pl.pallas_call"):
        lst = _spec_list(m, call, "in_specs" if side == "args" else "out_specs")
        if lst is not None and index < len(lst):
            specs.append(lst[index])
    if len(specs) != 1:
        return None
    spec = _resolve_spec(m, specs[0])
    if spec is None or len(spec.args) != 2:
        return None
    shape, index_map = spec.args
    if _short_by_one(shape, index_map) and len(index_map.body.elts) == rank:
        # the index map walks all the array's dims, the block lacks the first: it is the squeezed
        # one the map indexes and the kernel reads without. Every block one dim short of its own
        # index map has the same fault, named or not: all get it at once.
        for call in m.calls("pl.BlockSpec"):
            if len(call.args) == 2 and _short_by_one(*call.args):
                m.rewrite(call.args[0], "(None, " + ", ".join(m.text(e) for e in call.args[0].elts) + ")")
        return m.result()
    if not (isinstance(shape, ast.Tuple) and len(shape.elts) == rank - 1 and isinstance(index_map, ast.Lambda)
            and isinstance(index_map.body, ast.Tuple) and len(index_map.body.elts) == rank - 1):
        return None
    params = [a.arg for a in index_map.args.args]
    used = _names_in(index_map.body)
    unused = [p for p in params if p not in used]
    if not unused:
        return None
    m.rewrite(shape, "(None, " + ", ".join(m.text(e) for e in shape.elts) + ")")
    m.rewrite(index_map.body, f"({unused[0]}, " + ", ".join(m.text(e) for e in index_map.body.elts) + ")")
    return m.result()


# --- surface --------------------------------------------------------------------------------------

@_with_module
def repair_interpret_flag(m: RepairModule, message: str) -> None:
    """Remove `interpret=True` from pl.pallas_call."""
    for call in m.calls("pl.pallas_call"):
        for kw in call.keywords:
            if kw.arg == "interpret" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                _delete_keyword(m, kw)


@_with_module
def repair_wrong_values(m: RepairModule, message: str) -> None:
    """An index map returning `i + 1` -> `i`; a grid size `n // bn` -> `pl.cdiv(n, bn)` (where the
    dim is not padded to whole blocks first)."""
    for call in m.calls("pl.BlockSpec"):
        maps = [a for a in call.args if isinstance(a, ast.Lambda)] + [
            k.value for k in call.keywords if k.arg == "index_map" and isinstance(k.value, ast.Lambda)]
        for lam in maps:
            params = {a.arg for a in lam.args.args}
            elts = lam.body.elts if isinstance(lam.body, ast.Tuple) else [lam.body]
            for e in elts:
                if (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add) and isinstance(e.left, ast.Name)
                        and e.left.id in params and _int_value(e.right) == 1):
                    m.rewrite(e, e.left.id)
    for call in m.calls("pl.pallas_call", "pltpu.PrefetchScalarGridSpec"):
        grid = next((k.value for k in call.keywords if k.arg == "grid"), None)
        if grid is None:
            continue
        func = m.function_of(call)
        if re.search(r"jnp\.pad\(|round_up\(", m.text(func) if func is not None else m.source):
            continue  # the dims are padded to whole blocks: a floor grid is exact
        if re.search(r"%\s*\w+\s*==\s*0", m.source):
            continue  # blocks chosen to divide their dims
        def assigned(node: ast.expr | None) -> ast.expr | None:
            """A name's value where the grid's function assigns it once (`grid_m = m // bm`)."""
            if not isinstance(node, ast.Name):
                return node
            values = [a.value for a in m.nodes(ast.Assign) if m.function_of(a) is func and len(a.targets) == 1
                      and isinstance(a.targets[0], ast.Name) and a.targets[0].id == node.id]
            return values[0] if len(values) == 1 else None

        grid = assigned(grid)
        elts = grid.elts if isinstance(grid, ast.Tuple) else [grid] if grid is not None else []
        for e in map(assigned, elts):
            if isinstance(e, ast.BinOp) and isinstance(e.op, ast.FloorDiv):
                m.rewrite(e, f"pl.cdiv({m.text(e.left)}, {m.text(e.right)})")


_PROSE = re.compile(r"^(```|\*\*|#{1,6}\s|[-*]\s+\w|\d+\.\s+[A-Za-z]|>\s)|"
                    r"^[A-Za-z][\w'’]*,?(\s+[\w'’`()*,.:;/-]+){2,}[.:!?]?$")


def _looks_like_prose(line: str) -> bool:
    s = line.strip()
    if not s:
        return False
    if s.startswith(("```", "**", "> ")) or re.match(r"^#{1,6}\s", s) and False:
        return True
    first = re.match(r"[A-Za-z_]\w*", s)
    if first and (keyword.iskeyword(first.group()) or first.group() in ("match", "case", "print")):
        return False
    if re.search(r"\s=\s|[=+\-*/]=|\w\(|\[|\]|^\w+\.\w+\(", s) and not s.startswith(("- ", "* ")):
        # code-like: assignments, calls, subscripts (prose rarely has these, but may quote code)
        words = re.findall(r"[A-Za-z]{2,}", s)
        if len(words) < 5 or not re.match(r"^[A-Z]", s):
            return False
    return bool(_PROSE.match(s))


def repair_prose_in_code(source: str, message: str = "") -> str | None:
    """Delete lines of English prose or markdown that stop the module from parsing."""
    lines = source.splitlines(keepends=True)
    changed = False
    for _ in range(len(lines) + 1):
        text = "".join(lines)
        try:
            parse_module(text)
            break
        except SyntaxError as err:
            lineno = err.lineno or 0
        candidates = [n for n in (lineno, lineno - 1) if 1 <= n <= len(lines) and _looks_like_prose(lines[n - 1])]
        if not candidates:
            # the error may surface later than the prose (an unclosed quote or bracket): the first prose line
            candidates = [n for n in range(1, min(lineno, len(lines)) + 1) if _looks_like_prose(lines[n - 1])
                          and _not_python(lines[n - 1])][:1]
        if not candidates:
            break
        del lines[candidates[0] - 1]
        changed = True
    if not changed:
        return None
    out = "".join(lines)
    return out if out != source else None


def _not_python(line: str) -> bool:
    s = line.strip()
    for wrapped in (s, s + "\n    pass"):
        try:
            parse_module(wrapped)
            return False
        except SyntaxError:
            pass
    return True


def repair_wrong_entry_point(source: str, message: str = "") -> str | None:
    """No top-level `kernel`, but one public top-level function that is not a Pallas kernel
    body: rename it to `kernel` (its definition and uses)."""
    m = parse_source(source)
    if m is None:
        return None
    top = [f for f in m.tree.body if isinstance(f, ast.FunctionDef)]
    if any(f.name == "kernel" for f in top) or any(
            isinstance(t, ast.Name) and t.id == "kernel" for a in m.tree.body if isinstance(a, ast.Assign)
            for t in a.targets):
        return None
    public = [f for f in top if not f.name.startswith("_") and f not in m.kernels]
    if len(public) != 1:
        return None
    name = public[0].name
    f = public[0]
    line = m._bytes[f.lineno - 1]
    col = line.find(f"def {name}".encode())
    if col < 0:
        return None
    start = m.offset(f.lineno, col + 4)
    m.edit(start, start + len(name), "kernel")
    for n in m.nodes(ast.Name):
        if n.id == name:
            m.rewrite(n, "kernel")
    return m.result()


def repair_undefined_name(source: str, message: str = "") -> str | None:
    """A standard import left out (`name 'jnp' is not defined`): add it after the last
    top-level import."""
    found = re.search(r"name '(\w+)' is not defined", message)
    if found is None or found.group(1) not in STANDARD_IMPORTS:
        return None
    try:
        tree = parse_module(source)
    except SyntaxError:
        return None
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    line = max((n.end_lineno for n in imports), default=0)
    lines = source.splitlines(keepends=True)
    return "".join(lines[:line]) + STANDARD_IMPORTS[found.group(1)] + "\n" + "".join(lines[line:])


def _stand_in_code(module: ModuleType) -> str:
    """A stand-in module's code for a candidate (data_gen/repairs/pallas_ops.py, kernel_ops.py),
    as written there: its imports, constants and functions, without its docstring and its
    closing table of names (STAND_INS)."""
    text = Path(module.__file__).read_text()
    body = parse_module(text).body
    lines = text.splitlines()[body[1].lineno - 1:body[-1].lineno - 1]
    while lines and (not lines[-1].strip() or lines[-1].startswith("#")):
        lines.pop()
    return "\n".join(lines)


def repair_work_outside(source: str, message: str = "") -> str | None:
    """A convolution or matmul left to XLA outside the kernels (`jax.lax.conv_general_dilated`,
    `jax.lax.conv_transpose`, `jnp.matmul`, `jnp.dot`): call the verified Pallas stand-in of
    data_gen/repairs/pallas_ops.py instead, same arguments, its code appended to the module."""
    from data_gen.repairs import pallas_ops
    from data_gen.repairs.pallas_ops import STAND_INS

    m = parse_source(source)
    if m is None or "_verified_matmul_kernel" in source:
        return None
    inside = _kernel_helpers(m)
    for call in m.calls(*STAND_INS):
        if (m.kernel_of_node(call) is None and m.function_of(call) not in inside
                and not any(k.arg == "batch_group_count" for k in call.keywords)):
            m.rewrite(call.func, STAND_INS[dotted_name(call.func)])
    if not m.edits:
        return None
    _append_stand_ins(m, "Verified Pallas stand-ins for XLA's convolutions and matmuls (multiply-adds in a "
                         "blocked Pallas matmul)", pallas_ops)
    return m.result()


def _append_stand_ins(m: RepairModule, heading: str, module: ModuleType) -> None:
    """Record the edit that appends a stand-in module's code to the candidate, under a comment."""
    m.edits.append((len(m.source), len(m.source), ("" if m.source.endswith("\n") else "\n")
                    + f"\n\n# {heading}\n" + _stand_in_code(module) + "\n"))


def _kernel_helpers(m: RepairModule) -> set[ast.FunctionDef]:
    """Functions a kernel body calls, directly or through each other (a `_dot` helper): their
    products already run inside the kernel."""
    by_name = {f.name: f for f in m.nodes(ast.FunctionDef)}
    found: set[ast.FunctionDef] = set()
    todo = list(m.kernels)
    while todo:
        for call in (n for n in ast.walk(todo.pop()) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            helper = by_name.get(call.func.id)
            if helper is not None and helper not in found and helper not in m.kernels:
                found.add(helper)
                todo.append(helper)
    return found


def _traced_bool_or_slice(source: str, message: str = "") -> str | None:
    """A traced bool comes from a Python branch, or (in this jax) from a Python slice of a ref
    with traced bounds: try the branch fix, then the slice fix."""
    return repair_traced_bool(source, message) or repair_traced_index(source, message)


REPAIRERS: dict[str, Repairer] = {
    "undefined_name": repair_undefined_name,
    "block_alignment": repair_block_alignment,
    "vmem_exhaustion": repair_vmem_exhaustion,
    "traced_bool": _traced_bool_or_slice,
    "traced_index": repair_traced_index,
    "unsupported_op": repair_unsupported_op,
    "api_misuse": repair_api_misuse,
    "captured_constant": repair_captured_constant,
    "ref_store_mismatch": repair_ref_store_mismatch,
    "shape_error": repair_shape_error,
    "triton_primitive": repair_triton_primitive,
    "block_rank": repair_block_rank,
    "interpret_flag": repair_interpret_flag,
    "wrong_values": repair_wrong_values,
    "prose_in_code": repair_prose_in_code,
    "wrong_entry_point": repair_wrong_entry_point,
    "work_outside": repair_work_outside,
}


def repair(kind: str, source: str, message: str = "") -> str | None:
    """The source with `kind`'s repair applied, or None when the repairer finds nothing to change."""
    if kind not in REPAIRERS:
        raise KeyError(f"unknown repair kind {kind!r}; known: {', '.join(REPAIRERS)}")
    return REPAIRERS[kind](source, message)


def _check_repairers() -> None:
    unknown = [k.name for k in KINDS if k.repairer and k.repairer not in REPAIRERS]
    if unknown:
        raise ImportError(f"failure kinds name repairers that data_gen/repairs/repairers.py lacks: {unknown}")


_check_repairers()
