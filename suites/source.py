"""Reading and rewriting a peer suite's Python files as text, on the AST: nothing here runs them.

Two jobs: drop JAXBench's benchmark harness from a file (so a candidate written in their format
meets our policy without edits by its author), and rewrite a file's sizes (CONFIG entries,
module-level constants, literals in its input maker) so that it builds a case of our choosing.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from evaluator.candidate.policy import parse_module

# Only integers at least this large are sizes; smaller ones (kernel sizes, strides, top_k,
# group counts of 8) keep their values.
MIN_SIZE = 16
# Functions of theirs that are harness, not workload: removed with what only they import.
HARNESS_FUNCTIONS = frozenset({"benchmark"})
# Methods too: KernelBench-JAX's loader of PyTorch weights (the grader sets the weights itself).
HARNESS_METHODS = frozenset({"set_weights"})


@dataclass
class Stripped:
    source: str
    removed: list[str] = field(default_factory=list)  # what went, for the verdict's details


def strip_harness(source: str) -> Stripped:
    """The file without its `benchmark()` function, its `if __name__ == '__main__':` block and
    the module-level imports that only those used (`import time`, `import json`)."""
    tree = parse_module(source)
    methods = [m for n in tree.body if isinstance(n, ast.ClassDef) for m in n.body
               if isinstance(m, ast.FunctionDef) and m.name in HARNESS_METHODS and len(n.body) > 1]
    harness = [n for n in tree.body if _is_harness(n)] + methods
    if not harness:
        return Stripped(source)
    kept_nodes = [n for n in tree.body if n not in harness]
    used_by_harness = {name for n in harness for name in _names_used(n)}
    used_elsewhere = {name for n in kept_nodes if not isinstance(n, (ast.Import, ast.ImportFrom))
                      for name in _names_used(n)}
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line, replacement), 1-based
    removed = [_describe(n) for n in harness]
    for node in harness:
        edits.append((_first_line(node), node.end_lineno, ""))
    for node in kept_nodes:
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.col_offset:
            continue
        drop = [a for a in node.names if _bound_name(a) in used_by_harness - used_elsewhere]
        if not drop:
            continue
        removed.append(f"import of {', '.join(_bound_name(a) for a in drop)} (used only by the harness)")
        rest = [a for a in node.names if a not in drop]
        text = "" if not rest else ast.unparse(_with_names(node, rest)) + "\n"
        edits.append((node.lineno, node.end_lineno, text))
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1:last] = [text] if text else []
    return Stripped("".join(lines), removed)


def _is_harness(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HARNESS_FUNCTIONS:
        return True
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _describe(node: ast.stmt) -> str:
    if isinstance(node, ast.If):
        return "the `if __name__ == '__main__':` block"
    if node.name in HARNESS_METHODS:
        return f"the {node.name}() method (the grader sets the weights)"
    return f"the {node.name}() function"


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _with_names(node: ast.Import | ast.ImportFrom, names: list[ast.alias]) -> ast.stmt:
    if isinstance(node, ast.Import):
        return ast.Import(names=names)
    return ast.ImportFrom(module=node.module, names=names, level=node.level)


def top_level_names(source: str) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in parse_module(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {_bound_name(a) for a in node.names}
    return names


# --- sizes --------------------------------------------------------------------------------------
def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def config_sizes(source: str) -> dict[str, int]:
    """The integer entries of a module-level `CONFIG = {...}` dict (JAXBench's sizes)."""
    for node in parse_module(source).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str) and _is_int(v)}
    return {}


_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}


def _int_value(node: ast.AST) -> int | None:
    """The value of a literal integer expression (`8192 * 2`), None for anything else."""
    if _is_int(node):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _int_value(node.left), _int_value(node.right)
        if left is not None and right is not None:
            return _ARITHMETIC[type(node.op)](left, right)
    return None


def _constant_assignments(tree: ast.Module) -> list[tuple[ast.Assign, dict[str, int]]]:
    """Module-level assignments of literal sizes, with the size each name gets: `n = 4096`,
    `N = 2048 * 2`, `D, H, W = 16, 32, 32`, `height = width = 128`, `input_shape = (4096,)`
    (as input_shape_0). Expressions that read other names are derived sizes: they follow."""
    found = []
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        items = value.elts if isinstance(value, ast.Tuple) else [value]
        ints = [_int_value(v) for v in items]
        if not items or any(v is None for v in ints):
            continue
        sizes: dict[str, int] = {}
        for target in node.targets:
            if isinstance(target, ast.Name) and isinstance(value, ast.Tuple):
                sizes.update({f"{target.id}_{i}": v for i, v in enumerate(ints)})
            elif isinstance(target, ast.Name):
                sizes[target.id] = ints[0]
            elif isinstance(target, ast.Tuple) and len(target.elts) == len(ints) and \
                    all(isinstance(t, ast.Name) for t in target.elts):
                sizes.update({t.id: v for t, v in zip(target.elts, ints)})
        if sizes:
            found.append((node, sizes))
    return found


def module_constants(source: str) -> dict[str, int]:
    """Module-level literal sizes by name (KernelBench's `batch_size = 16`, `N = 2048 * 2`)."""
    return {k: v for _, sizes in _constant_assignments(parse_module(source)) for k, v in sizes.items()}


def function_reads(source: str, function: str, name: str) -> bool:
    """Whether a top-level function reads a name (create_inputs reading CONFIG, or not)."""
    for node in parse_module(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return name in _names_used(node)
    return False


# Calls whose integer arguments are seeds or counts of keys, not sizes.
RANDOM_KEY_CALLS = frozenset({"key", "PRNGKey", "split", "fold_in"})


def literal_sizes(source: str, function: str) -> set[int]:
    """Integer literals of at least MIN_SIZE inside a top-level function: the sizes a file
    hard-codes in its input maker instead of reading them from CONFIG (seeds excluded)."""
    for node in parse_module(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            seeds = {id(a) for call in ast.walk(node) if isinstance(call, ast.Call)
                     and _called_name(call) in RANDOM_KEY_CALLS for a in call.args}
            return {n.value for n in ast.walk(node) if _is_int(n) and n.value >= MIN_SIZE and id(n) not in seeds}
    return set()


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def default_dtype(source: str, function: str = "create_inputs") -> str | None:
    """The dtype a JAXBench input maker defaults to: `dtype=jnp.bfloat16` -> 'bfloat16'."""
    for node in parse_module(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args
            for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
                if arg.arg == "dtype" and isinstance(default, ast.Attribute):
                    return default.attr
    return None


@dataclass(frozen=True)
class SizeEdit:
    """New sizes for a file: CONFIG entries and module constants by name, and integer literals
    by value inside the named functions (only where a file hard-codes its shapes)."""

    config: dict[str, int] = field(default_factory=dict)
    constants: dict[str, int] = field(default_factory=dict)
    literals: dict[int, int] = field(default_factory=dict)
    literal_scopes: frozenset[str] = frozenset()


def rewrite_sizes(source: str, edit: SizeEdit) -> str:
    """The source with the sizes named by `edit` replaced; layout and comments kept."""
    tree = parse_module(source)
    spans: dict[tuple[int, int, int, int], str] = {}  # (line, col, end line, end col) -> new text

    def put(node: ast.AST, text: str) -> None:
        spans[(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)] = text

    for node, sizes in _constant_assignments(tree):
        new = {k: edit.constants.get(k, v) for k, v in sizes.items()}
        if new != sizes:
            values = _assigned_values(node, new)
            put(node.value, ", ".join(map(str, values)) if isinstance(node.value, ast.Tuple) and
                len(values) > 1 else f"({values[0]},)" if isinstance(node.value, ast.Tuple) else str(values[0]))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and _is_int(v) and edit.config.get(k.value, v.value) != v.value:
                    put(v, str(edit.config[k.value]))
        elif isinstance(node, ast.FunctionDef) and node.name in edit.literal_scopes:
            for n in ast.walk(node):
                if _is_int(n) and edit.literals.get(n.value, n.value) != n.value:
                    put(n, str(edit.literals[n.value]))
    lines = source.splitlines(keepends=True)
    for (line, col, end_line, end_col), text in sorted(spans.items(), reverse=True):
        head = lines[line - 1].encode()[:col]
        tail = lines[end_line - 1].encode()[end_col:]
        lines[line - 1:end_line] = [(head + text.encode() + tail).decode()]
    return "".join(lines)


def _assigned_values(node: ast.Assign, sizes: dict[str, int]) -> list[int]:
    """The values an assignment's right-hand side must hold to give its names `sizes`."""
    target = node.targets[0]
    if isinstance(target, ast.Name) and isinstance(node.value, ast.Tuple):
        return [sizes[f"{target.id}_{i}"] for i in range(len(node.value.elts))]
    if isinstance(target, ast.Name):
        return [sizes[target.id]]
    return [sizes[t.id] for t in target.elts]
