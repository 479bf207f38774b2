"""Stage 2: parse the candidate and apply the static policy, on the AST, before it runs.

Each check is a small function from an AST node to a list of violations. The worker's
sandbox is the second line of defence; this stage refuses the obvious and explains why.
"""
from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from typing import Callable

# The rule: jax (public API, jax.experimental.pallas.ops helpers included: a library *kernel*
# is refused later, by provenance), numpy and ml_dtypes, and the standard library modules that
# only compute on Python values. Refused by omission: anything that reaches the OS, files,
# processes, threads, the network or the clock (os, sys, io, pathlib, subprocess, socket,
# threading, time, signal, atexit...), the interpreter's own state (gc, inspect, importlib,
# ctypes, builtins, traceback...), or that builds or loads code at run time (types, whose
# FunctionType/CodeType would get past this AST check; pickle, marshal, ast, codeop...).
ALLOWED_MODULES = (
    "jax", "numpy", "ml_dtypes",
    "__future__", "abc", "bisect", "cmath", "collections", "contextlib", "copy", "dataclasses",
    "decimal", "enum", "fractions", "functools", "heapq", "itertools", "json", "math", "numbers",
    "operator", "re", "statistics", "string", "textwrap", "typing", "warnings",
)
# Inside jax: private internals reach the interpreter state; host_callback runs host code.
FORBIDDEN_MODULE_PARTS = ("_src", "host_callback", "compilation_cache", "profiler", "jax.tools")


@dataclass(frozen=True)
class Violation:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class PolicySyntaxError(ValueError):
    pass


# Rationale: running code hidden from this AST (eval/exec), touching files, frames,
# globals or the import machinery defeats every other check.
FORBIDDEN_BUILTINS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "breakpoint",
    "input", "setattr", "delattr", "exit", "quit", "memoryview", "__builtins__", "help",
})
# Rationale: interpret mode is the evaluator's choice; global config changes would leak
# into the grading of other candidates; numpy's file I/O is file access.
FORBIDDEN_ATTRIBUTES = frozenset({
    "force_tpu_interpret_mode", "set_tpu_interpret_mode", "reset_tpu_interpret_mode_state",
    "InterpretParams", "config", "tofile", "ctypeslib", "modules", "clear_caches", "clear_backends",
})
NUMPY_FILE_IO = frozenset({"load", "save", "savez", "savez_compressed", "fromfile", "memmap",
                           "loadtxt", "savetxt", "genfromtxt", "DataSource", "lib"})
ALLOWED_DUNDERS = frozenset({"__name__", "__doc__", "__main__"})


@dataclass(frozen=True)
class Context:
    modules: dict[str, str]  # local name -> module it is bound to by an import
    allowed_nodes: frozenset[int] = frozenset()  # ids of nodes an idiom makes acceptable

    def module_of(self, node: ast.AST) -> str | None:
        """'jax.numpy' for `jnp` or `jax.numpy`, when the chain starts at an imported name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.modules:
            return None
        return ".".join([self.modules[node.id], *reversed(parts)])


def check_import(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: an allow-list, not a block-list: os, sys, gc, inspect, ctypes, threading,
    # subprocess, socket, time, importlib, pickle... are all refused by omission.
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            return [Violation(node.lineno, "relative imports are not allowed")]
        base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = []
    for name in names:
        root = name.split(".")[0]
        if root not in ALLOWED_MODULES:
            out.append(Violation(node.lineno, f"import of {root!r} is not allowed "
                                              f"(allowed: {', '.join(ALLOWED_MODULES)})"))
        elif any(part in name for part in FORBIDDEN_MODULE_PARTS):
            out.append(Violation(node.lineno, f"import of {name!r} is not allowed"))
    return out


def check_name(node: ast.AST, ctx: Context) -> list[Violation]:
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS:
        return [Violation(node.lineno, f"use of {node.id!r} is not allowed")]
    return []


def check_attribute(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: dunder attributes (__class__, __globals__, __subclasses__, __dict__...)
    # are how sandboxed Python escapes to builtins and other modules.
    if not isinstance(node, ast.Attribute) or id(node) in ctx.allowed_nodes:
        return []
    if node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
        return [Violation(node.lineno, f"access to {node.attr!r} is not allowed")]
    if node.attr in FORBIDDEN_ATTRIBUTES:
        return [Violation(node.lineno, f"use of .{node.attr} is not allowed")]
    if node.attr in NUMPY_FILE_IO and ctx.module_of(node.value) in ("numpy", "jax.numpy"):
        return [Violation(node.lineno, f"file access ({ctx.module_of(node)}) is not allowed")]
    return []


def check_module_patching(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: assigning to a module attribute (jnp.dot = ..., pl.pallas_call = ...) changes
    # the library for the grader and for every candidate the worker grades after this one.
    targets: list[ast.AST] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    out = []
    for target in targets:
        for sub in ast.walk(target):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del))
                    and ctx.module_of(sub.value)):
                out.append(Violation(node.lineno, f"changing {ctx.module_of(sub)} (monkeypatching "
                                                  "a library) is not allowed"))
    return out


def check_getattr(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: getattr with a computed name hides which attribute is reached.
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            return [Violation(node.lineno, f"{node.func.id}() needs a literal attribute name")]
        attr = node.args[1].value
        if attr.startswith("__") or attr in FORBIDDEN_ATTRIBUTES:
            return [Violation(node.lineno, f"{node.func.id}(..., {attr!r}) is not allowed")]
    return []


def check_interpret_keyword(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: the evaluator decides how kernels run; `interpret=True` would make a
    # kernel run as plain JAX on any backend and skip TPU semantics. Only a literal is refused
    # here: `interpret=interpret` (a parameter defaulting to False, as in jax's own kernels) is
    # fine, and whatever value a pallas_call really gets is checked where it is traced
    # (stage 4), so computed values cannot get past.
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "interpret" and _truthy_literal(kw.value):
                return [Violation(node.lineno, "setting interpret= is not allowed: the evaluator "
                                               "chooses how kernels run")]
            if kw.arg is None and isinstance(kw.value, ast.Dict):  # **{"interpret": True}
                for key, value in zip(kw.value.keys, kw.value.values):
                    if isinstance(key, ast.Constant) and key.value == "interpret" and _truthy_literal(value):
                        return [Violation(node.lineno, "setting interpret= is not allowed")]
    return []


def _truthy_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and bool(node.value)


def check_strings(node: ast.AST, ctx: Context) -> list[Violation]:
    # Rationale: a string naming a forbidden module or dunder is how obfuscated access starts.
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith("__") and node.value.endswith("__") and node.value not in ALLOWED_DUNDERS:
            return [Violation(node.lineno, f"the string {node.value!r} is not allowed")]
    return []


CHECKS: tuple[Callable[[ast.AST, Context], list[Violation]], ...] = (
    check_import, check_name, check_attribute, check_getattr, check_interpret_keyword,
    check_strings, check_module_patching,
)


# CPython 3.11's AST constructor keeps its recursion counter in shared state, so two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth mismatch"
# (python/cpython#106905). The grader and data_gen work on threads; parsing is cheap, so every
# parse in this process goes through parse_module.
_PARSE_LOCK = threading.Lock()


def parse_module(source: str, filename: str = "<source>") -> ast.Module:
    """ast.parse, safe to call from any thread of this process (see _PARSE_LOCK)."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def parse(source: str) -> ast.Module:
    try:
        return parse_module(source, filename="candidate.py")
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise PolicySyntaxError(f"line {exc.lineno}: {exc.msg}" + (f": {line}" if line else "")) from None
    except ValueError as exc:  # e.g. null bytes
        raise PolicySyntaxError(str(exc)) from None


def violations(tree: ast.Module) -> list[Violation]:
    ctx = Context(modules=_imported_names(tree), allowed_nodes=_frozen_dataclass_setattrs(tree))
    found: list[Violation] = []
    for node in ast.walk(tree):
        for check in CHECKS:
            found.extend(check(node, ctx))
    return sorted(set(found), key=lambda v: v.line)


def imports_pallas(tree: ast.Module) -> bool:
    """Whether the module imports anything from jax.experimental.pallas: without it, it cannot
    contain a Pallas kernel, whatever its tracing does."""
    def pallas(module: str) -> bool:
        return module == "jax.experimental.pallas" or module.startswith("jax.experimental.pallas.")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(pallas(a.name) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                pallas(node.module) or any(pallas(f"{node.module}.{a.name}") for a in node.names)):
            return True
    return False


def _imported_names(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # `import jax.numpy` binds `jax`; `... as jnp` binds the module
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _frozen_dataclass_setattrs(tree: ast.Module) -> frozenset[int]:
    """`object.__setattr__(self, "name", value)` in a class's own method: how a frozen
    dataclass sets a field in __post_init__ (jax's own kernels do). Only that exact shape:
    the receiver is the method's first parameter and the name a plain literal."""
    allowed = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
                continue
            receiver = method.args.args[0].arg
            for call in (n for n in ast.walk(method) if isinstance(n, ast.Call)):
                func = call.func
                if (isinstance(func, ast.Attribute) and func.attr == "__setattr__"
                        and isinstance(func.value, ast.Name) and func.value.id == "object"
                        and len(call.args) == 3 and not call.keywords
                        and isinstance(call.args[0], ast.Name) and call.args[0].id == receiver
                        and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str)
                        and not call.args[1].value.startswith("__")):
                    allowed.add(id(func))
    return frozenset(allowed)
