"""The layout contract (docs/architecture.md): our packages import each other's public names
only, neither modules nor packages import each other in a cycle, and packages import only
those below them in LAYERS (function-level imports count: a lazy import hides a cycle or an
upward arrow, it does not remove it)."""
import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("tasks", "evaluator", "suites", "chat", "cli", "data_gen", "training")
# Bottom to top: a package may import only packages before it here. The grading core
# (evaluator) imports neither the peer suites nor the shell; suites and chat do not import each
# other (their order between themselves is arbitrary); the shell (cli) serves data_gen and training.
LAYERS = ("tasks", "evaluator", "suites", "chat", "cli", "data_gen", "training")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()
# A package's __main__.py is a launcher that belongs to the shell, not to its package:
# `python -m evaluator` is a stable entry point, so evaluator/__main__.py stays where it is but
# only starts cli.main. Nothing imports a launcher, so leaving it out of the import graph hides
# no cycle; counting it would draw an evaluator -> cli arrow that the core does not have.
LAUNCHERS = frozenset(m for m in MODULES if m.endswith(".__main__"))


def _ours(name: str) -> str | None:
    """The module of ours that `name` (a dotted import target) is, or lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module of ours, imported name or None, line) for every import in a module."""
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            out += [(m, None, node.lineno) for a in node.names if (m := _ours(a.name))]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (m := _ours(node.module or "")):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:  # `from evaluator import perf_model`: a module
                    out.append((sub, None, node.lineno))
                else:
                    out.append((m, alias.name, node.lineno))
    return out


def test_no_module_imports_a_private_name_of_another():
    offences = [f"{module}:{line} imports {name} from {target}"
                for module in MODULES for target, name, line in _imports(module)
                if name and name.startswith("_") and target != module]
    assert not offences, "\n".join(offences)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_among_modules_or_packages():
    modules = {m: {t for t, _, _ in _imports(m) if t != m} for m in MODULES if m not in LAUNCHERS}
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    modules = {m: {t for t in ts if not (m in PACKAGES and t.startswith(m + "."))} for m, ts in modules.items()}
    assert _cycle(modules) is None, " -> ".join(_cycle(modules))
    packages: dict[str, set[str]] = {}
    for m, targets in modules.items():
        packages.setdefault(m.split(".")[0], set()).update(
            t.split(".")[0] for t in targets if t.split(".")[0] != m.split(".")[0])
    assert _cycle(packages) is None, " -> ".join(_cycle(packages))


def test_packages_import_only_the_layers_below_them():
    assert sorted(LAYERS) == sorted(PACKAGES)
    rank = {package: i for i, package in enumerate(LAYERS)}
    offences = []
    for module in sorted(set(MODULES) - LAUNCHERS):
        source = module.split(".")[0]
        for target, _, line in _imports(module):
            dest = target.split(".")[0]
            if rank[dest] > rank[source]:
                offences.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} imports {target} "
                                f"({source} -> {dest}, but {dest} lies above {source})")
    assert not offences, "layers, bottom to top: " + " < ".join(LAYERS) + "\n" + "\n".join(offences)


# The packages whose top level is a front door over subpackages of one concern each.
LAYERED = ("evaluator", "data_gen")
MAX_TOP_LEVEL_MODULES = 10


def _subpackages(package: str) -> list[str]:
    return sorted(m for m, path in MODULES.items()
                  if path.name == "__init__.py" and m.count(".") == 1 and m.startswith(package + "."))


def _may_import(subpackage: str) -> set[str]:
    """The subpackages of its own package that `subpackage` says it may import: the "May import:"
    line of its __init__ docstring, "nothing ..." for none."""
    doc = ast.get_docstring(ast.parse(MODULES[subpackage].read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert len(lines) == 1, f"{subpackage}/__init__.py: its docstring must say once what it may import (May import: ...)"
    named = lines[0].removeprefix("May import:").strip().rstrip(".")
    return set() if named.startswith("nothing") else {name.strip() for name in named.split(",")}


def test_front_doors_are_small_and_subpackages_never_import_up():
    """evaluator/ and data_gen/: at most MAX_TOP_LEVEL_MODULES modules at the top (their front
    door: the grader and its stages; the data commands), each subpackage importing only the
    sibling subpackages its docstring names, and never its front door."""
    offences = []
    for package in LAYERED:
        top = sorted((ROOT / package).glob("*.py"))
        assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{package}/ holds {len(top)} modules at its top: {[p.name for p in top]}"
        subpackages = _subpackages(package)
        assert subpackages, f"{package} has no subpackages"
        for sub in subpackages:
            allowed = _may_import(sub)
            assert allowed <= set(subpackages), f"{sub} names what is not a subpackage of {package}: {allowed}"
            for module in (m for m in MODULES if m == sub or m.startswith(sub + ".")):
                for target, _, line in _imports(module):
                    if target.split(".")[0] != package or target == sub or target.startswith(sub + "."):
                        continue
                    owner = next((s for s in subpackages if target == s or target.startswith(s + ".")), None)
                    if owner is None:
                        offences.append(f"{module}:{line} imports {target}: up, into {package}'s front door")
                    elif owner not in allowed:
                        offences.append(f"{module}:{line} imports {target}, but {sub} may import only "
                                        f"{sorted(allowed) or 'none of its siblings'}")
    assert not offences, "\n".join(offences)


def test_every_parse_goes_through_the_one_thread_safe_parser():
    """Python 3.11's ast.parse keeps its recursion depth in shared state: two threads parsing at
    once can fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython
    #106905; it ended a 3-seed run of benchmarks/seed_stability.py at 99%). The grader, data_gen
    and the suites parse on threads, so every parse goes through evaluator.candidate.policy.parse_module,
    which holds a lock."""
    callers = []
    for package in (*PACKAGES, "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "parse" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "ast"):
                    callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [c.split(":")[0] for c in callers] == ["evaluator/candidate/policy.py"], callers
