"""When are two kernels the same kernel? Source normalised up to comments, layout and names.

Two modules that differ only in comments, docstrings, whitespace or what their identifiers are
called teach the same code, so they count as one kernel: the dataset's cap on pairs per repair,
its card and the variant pool all count kernels by `fingerprint`. Numbers, attribute names
(`jnp.dot`, `pl.BlockSpec`) and structure are kept: another block size or another algorithm is
another kernel.
"""
from __future__ import annotations

import ast
import hashlib
import re
from functools import lru_cache

from evaluator.candidate.policy import parse_module
from evaluator.digest import without_docstrings


@lru_cache(maxsize=8192)  # a dataset build asks for the same kernels many times
def normalized(source: str) -> str:
    """Source with comments and layout normalized away (names and docstrings kept): what
    deduplication of failing kernels compares."""
    try:
        return ast.dump(parse_module(source))
    except (SyntaxError, ValueError):
        return " ".join(re.sub(r"#[^\n]*", "", source).split())


def canonical(source: str) -> str:
    """The module without docstrings, with every name it binds renamed by order of first
    appearance, unparsed in one layout. Unparseable source falls back to `normalized`."""
    try:
        tree = parse_module(source)
    except (SyntaxError, ValueError):
        return normalized(source)
    without_docstrings(tree)
    names = _bound_names(tree)
    mapping: dict[str, str] = {}

    def rename(name: str) -> str:
        if name not in names:
            return name
        return mapping.setdefault(name, f"n{len(mapping)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = rename(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.name = rename(node.name)
        elif isinstance(node, ast.arg):
            node.arg = rename(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            node.arg = rename(node.arg)
        elif isinstance(node, ast.alias):
            node.asname = rename(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            node.value = rename(node.value)  # static_argnames=("bm",) names a parameter
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            node.names = [rename(n) for n in node.names]
    return ast.unparse(tree)


@lru_cache(maxsize=8192)
def fingerprint(source: str) -> str:
    """A short hash of `canonical(source)`: equal for kernels that differ only cosmetically."""
    return hashlib.sha256(canonical(source).encode()).hexdigest()[:16]


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the module itself binds: functions, classes, parameters, assigned variables and
    import aliases. Everything else (builtins, attributes) keeps its name."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names
