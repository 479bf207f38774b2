"""Mutant generation: every single-bug mutant of a correct kernel (`mutants`) and compounds of
two bugs with one repair (`compounds`, `compound_with`), made by applying the operators of
data_gen/failures/operators.py through the edit engine of data_gen/failures/edits.py.

It exists to decide which proposed bugs become mutants: unchanged or duplicate sources and
bugs in the syntax rather than the code are dropped here, and a compound pairs a static bug
with a semantic one on lines apart.
"""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass, replace

from data_gen.failures.edits import BugOperator, Mutant, Site, SourceModule
from data_gen.failures.giveaways import leftovers
from data_gen.failures.operators import OPERATORS, operator
from evaluator.candidate.policy import parse_module
from tasks.spec import Task

COMPOUND = "compound"


@dataclass(frozen=True)
class PendingMutant:
    """A bug whose site is found but whose mutant is not made yet. Finding sites is cheap; making
    a mutant (growing its site until no leftover remains, parsing the result) is most of the cost,
    so a run that takes a few of a kernel's mutants makes only those (`MutationSource.items`)."""

    module: SourceModule
    operator: str
    index: int
    site: Site
    variant: str
    variant_key: str

    def make(self) -> Mutant | None:
        """The mutant, or None where the bug would leave a leftover or break the syntax."""
        mutant = _mutant(self.module, self.operator, self.index, self.site, self.variant, self.variant_key)
        if mutant is None or (operator(self.operator).parses and _spans_lines(self.site) and not _parses(mutant)):
            return None
        return mutant


def pending_mutants(task: Task, operators: tuple[BugOperator, ...] = OPERATORS, kernel: str | None = None,
                    variant: str = "solution", variant_key: str = "") -> list[PendingMutant]:
    """Every bug site of a correct kernel of `task` (its solution unless `kernel`, a source, is
    given), in operator order, none of them made yet."""
    module = SourceModule(task.solution_source() if kernel is None else kernel, task)
    return [PendingMutant(module, op.name, index, site, variant, variant_key)
            for op in operators for index, site in enumerate(op.find(module))]


def mutants(task: Task, operators: tuple[BugOperator, ...] = OPERATORS, kernel: str | None = None,
            variant: str = "solution", variant_key: str = "") -> list[Mutant]:
    """Every mutant of a correct kernel of `task` (its solution unless `kernel`, a source, is
    given), in operator order; unchanged or duplicate sources dropped."""
    pending = pending_mutants(task, operators, kernel, variant, variant_key)
    out, seen = [], {p.module.source for p in pending}  # the kernel unchanged is no mutant
    for candidate in pending:
        mutant = candidate.make()
        if mutant is None or mutant.source in seen:
            continue
        seen.add(mutant.source)
        out.append(mutant)
    return out


def _spans_lines(site: Site) -> bool:
    """Edits within one line keep the module parseable; others are checked (parsing every
    mutant costs as much as making it)."""
    return any(e.start[0] != e.end[0] or "\n" in e.text for e in site.edits)


def _source_parses(source: str) -> bool:
    try:
        parse_module(source)
    except SyntaxError:
        return False
    return True


def _parses(mutant: Mutant) -> bool:
    """A bug is in the code, not in its syntax (a truncated answer aside)."""
    if mutant.operator != COMPOUND and not operator(mutant.operator).parses:
        return True
    return _source_parses(mutant.source)


def without_leftovers(module: SourceModule, site: Site) -> Site | None:
    """The site, grown so the bug leaves no trace of the code it replaced: a name the bug leaves
    unread loses its assignment (or its helper function), and `x = x` goes as a whole statement.
    None when a leftover cannot be removed that way: such a mutant would teach a model to spot the
    leftover instead of the bug."""
    read = {n.id for n in module.all_nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    for _ in range(4):
        try:
            tree = parse_module(module.apply(site)[0])
        except SyntaxError:
            return site  # a bug in the syntax itself: nothing to read
        unread, selfs = leftovers(tree)
        dead = unread & read
        if not dead and not selfs:
            return site
        grown = _grow(module, site, dead, selfs)
        if grown is None:
            return None
        site = grown
    return None


def _grow(module: SourceModule, site: Site, dead: set[str], selfs: set[str]) -> Site | None:
    """Delete, in the kernel the site edits, the bindings of `dead` and the statements that
    become `x = x` (for those, the site's own edit goes with the statement)."""
    edits = list(site.edits)
    for node in module.all_nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.FunctionDef) and not node.decorator_list:
            name = node.name
        else:
            continue
        inside = [e for e in edits if (node.lineno, node.col_offset) <= e.start and e.end <= (
            node.end_lineno, node.end_col_offset)]
        if name in selfs and inside:
            edits = [e for e in edits if e not in inside]
        elif name not in dead or inside:
            continue
        if _shares_lines(module, node):
            return None
        edits.append(module.delete_lines(node.lineno, node.end_lineno))
        dead.discard(name)
        selfs.discard(name)
    if dead or selfs:
        return None
    return replace(site, edits=edits)


def _shares_lines(module: SourceModule, node: ast.stmt) -> bool:
    """Whether the statement shares a line with other code (`a = 1; b = 2`)."""
    first, last = module.lines[node.lineno - 1], module.lines[node.end_lineno - 1]
    return bool(first[:node.col_offset].strip()) or bool(last.encode()[node.end_col_offset:].decode().split("#")[0].strip())


def _mutant(module: SourceModule, op: str, index: int, site: Site, variant: str, key: str) -> Mutant | None:
    grown = without_leftovers(module, site) if operator(op).parses else site  # a syntax bug has no names to read
    if grown is None:
        return None
    source, (facts,) = module.apply(grown)
    if grown.edits != site.edits and operator(op).parses and not _source_parses(source):
        return None  # a deletion left a body empty
    fallbacks = tuple(f for s in site.fallbacks if (f := _mutant(module, op, index, s, variant, key)))
    return Mutant(module.task.name, op, index, source, int(facts.get("line", site.line)), facts, variant, key,
                  fallbacks)


def compounds(task: Task, kernel: str, variant: str = "solution", variant_key: str = "") -> list[Mutant]:
    """Two bugs at once, one repair: a bug that stops the kernel before it runs (lowering, VMEM)
    with one that gives wrong results, at sites on different lines. The parts are the single
    bugs, so the collector can confirm each one fails by itself."""
    module = SourceModule(kernel, task)
    second = [(op, i, s) for op in OPERATORS if op.family == "semantic" for i, s in enumerate(op.find(module))]
    out = []
    for op_b, j, b in second:
        for op_a, i, a in _static_sites(module, b):
            combined = _combine(module, (op_a, i, a), (op_b, j, b), variant, variant_key, len(out))
            if combined is not None:
                out.append(combined)
    return out


def compound_with(task: Task, kernel: str, second: Mutant, pick: random.Random) -> Mutant | None:
    """A compound whose runtime bug is `second` (a mutant of `kernel`) and whose static bug is
    picked at random: the collector grades `second` by itself anyway, so confirming the
    compound's second bug costs nothing more."""
    module = SourceModule(kernel, task)
    site = operator(second.operator).find(module)[second.site]
    options = _static_sites(module, site)
    if not options:
        return None
    index = pick.randrange(len(options))
    return _combine(module, options[index], (operator(second.operator), second.site, site), second.variant,
                    second.variant_key, index)


def _static_sites(module: SourceModule, other: Site) -> list[tuple[BugOperator, int, Site]]:
    return [(op, i, s) for op in OPERATORS if op.static for i, s in enumerate(op.find(module)) if not _near(s, other)]


def _combine(module: SourceModule, first: tuple[BugOperator, int, Site], second: tuple[BugOperator, int, Site],
             variant: str, variant_key: str, index: int) -> Mutant | None:
    (op_a, i, a), (op_b, j, b) = first, second
    grown = [without_leftovers(module, a), without_leftovers(module, b)]
    parts = tuple(_mutant(module, op.name, k, site, variant, variant_key) for op, k, site in ((op_a, i, a), (op_b, j, b)))
    if None in grown or None in parts:
        return None
    source, (facts_a, facts_b) = module.apply(*grown)
    combined = Mutant(module.task.name, COMPOUND, index, source, int(facts_a["line"]), {}, variant, variant_key,
                      parts=(replace(parts[0], facts=facts_a, line=int(facts_a["line"])),
                             replace(parts[1], facts=facts_b, line=int(facts_b["line"]))))
    return combined if all(map(_parses, (combined, *parts))) else None


def _near(a: Site, b: Site) -> bool:
    """Whether two sites' edits come within two lines of each other."""
    lines = {n for e in a.edits for n in range(e.start[0] - 2, e.end[0] + 3)}
    return any(e.start[0] in lines or e.end[0] in lines for e in b.edits)
