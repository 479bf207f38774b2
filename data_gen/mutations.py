"""Bug operators: inject the mistakes models really make in Pallas TPU kernels into a verified kernel.

The kernels are a task's solution and its verified variants (data_gen/pool.py). Each operator
finds its sites on the kernel's AST and rewrites only the source text of that site, so the rest
of the file keeps its formatting and the repair is the original kernel. Comments and docstrings
that the bug makes false (the ones on and just above the edited lines, and any that mention what
the bug contradicts) are dropped, so the failing kernel never describes the correct code. An
operator only proposes a bug; the evaluator decides whether the mutant really fails, and a mutant
that still passes is dropped. Every site carries `facts` about the failing code (the function,
the line, the code as it now reads) for data_gen/explanations.py to write about.

The list of operators is `OPERATORS` at the bottom; docs/data-generation.md has the table.
"""
from __future__ import annotations

import ast
import hashlib
import io
import random
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from chat.prompts import reference_source
from evaluator.policy import parse_module
from tasks.spec import Task


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

    `hints` are words the bug makes false wherever a comment or docstring says them.
    `fallbacks` are the same bug at larger magnitudes, tried in order while the first survives.
    """

    edits: list[Edit]
    line: int
    facts: dict[str, str] = field(default_factory=dict)
    hints: tuple[str, ...] = ()
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

    def __init__(self, source: str, task: Task):
        self.source, self.task = source, task
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
        return (n for n in self.nodes(ast.Call) if _dotted(n.func) == dotted)

    def replace(self, node: ast.AST, text: str) -> Edit:
        return Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text)

    def delete_lines(self, first: int, last: int) -> Edit:
        return Edit((first, 0), (last + 1, 0), "")

    def site(self, node: ast.AST, after: str, hints: tuple[str, ...] = (), **facts: str) -> Site:
        """A rewrite of one node's text; the facts always include function, line, before and after."""
        facts = dict(function=self.function_name(node), line=str(node.lineno), before=self.text(node),
                     after=after, **facts)
        return Site([self.replace(node, after)], node.lineno, facts, hints)

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
        """Drop the comments and docstrings the bug makes false: those on the edited lines, the
        comment block just above them, and any that mention one of the site's hints."""
        edited = {line for e in site.edits for line in range(e.start[0], max(e.end[0], e.start[0]) + 1)}
        above = set()
        for first in sorted({e.start[0] for e in site.edits}):
            line = first - 1
            while line >= 1 and self.lines[line - 1].lstrip().startswith("#"):
                above.add(line)
                line -= 1
        hinted = (re.compile("|".join(rf"(?<![A-Za-z]){re.escape(h)}" for h in site.hints), re.IGNORECASE)
                  if site.hints else None)
        out = []
        for tok in self.comments:
            line, col = tok.start
            text = self.lines[line - 1]
            if line in edited - {e.end[0] for e in site.edits if e.deletes_lines}:
                pass
            elif not (line in above or (hinted and hinted.search(tok.string))):
                continue
            if text.lstrip().startswith("#"):
                out.append(self.delete_lines(line, line))
            else:
                code = text[:col].rstrip()
                out.append(Edit((line, len(code.encode())), (line, len(text.rstrip("\n").encode())), ""))
        if hinted:
            for node in self.nodes((ast.Module, ast.FunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and hinted.search(doc) and len(node.body) > 1:
                    out.append(self.delete_lines(node.body[0].lineno, node.body[0].end_lineno))
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
                if (isinstance(node.value, ast.Call) and _dotted(node.value.func) == "functools.partial"
                        and node.value.args and any(isinstance(t, ast.Name) and t.id == first.id
                                                    for t in node.targets)):
                    first = node.value.args[0]
        if isinstance(first, ast.Call) and _dotted(first.func) == "functools.partial" and first.args:
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


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _stable_pick(options: list[str], key: str) -> str:
    return options[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(options)]


@dataclass(frozen=True)
class BugOperator:
    """A kind of bug and where it applies. What to say about it lives in data_gen/explanations.py.

    `family` decides how much of a task's budget the operator may take: "surface" bugs are the
    ones whose feedback names the fix (truncation, a fake import, a misspelled keyword, no
    kernel), "static" ones fail before anything runs (lowering, VMEM), "semantic" ones run and
    give wrong values or crash.
    """

    name: str
    summary: str
    find: Callable[[SourceModule], list[Site]]
    family: str = "semantic"
    # Order in which a task's budget is spent, lowest first: 0 for bugs only a few kernels can have
    # (manual DMA, required features), 1 for the rest.
    priority: int = 1

    @property
    def static(self) -> bool:
        """The static stages (through lowering, the VMEM budget and the estimate) show this bug or
        nothing does: its mutants are graded through them only, and one that passes them is
        dropped as survived without running its cases (a survivor costs a full grading)."""
        return self.family == "static"


# --- site finders, one per operator --------------------------------------------------------------

_BLOCK_CONSTANTS = range(128, 4097, 128)


def _block_constants(m: SourceModule) -> Iterator[ast.Constant]:
    """Integer literals that look like block sizes: multiples of 128, outside index maps."""
    for node in m.nodes(ast.Constant):
        if type(node.value) is int and node.value in _BLOCK_CONSTANTS and not isinstance(
                m.parent.get(node), (ast.Tuple, ast.Lambda, ast.Subscript, ast.BinOp)):
            yield node


def _constant_name(m: SourceModule, node: ast.Constant) -> str:
    parent = m.parent.get(node)
    if isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Name):
        return parent.targets[0].id
    if isinstance(parent, ast.keyword) and parent.arg:
        return parent.arg
    return ""


def round_block(value: int) -> int:
    """The round number a person picks near a block size (100, 250, 500, 1100, 2100): the
    nearest multiple of 50 (of 100 from 1000 up) that is not a multiple of 8, so it fits
    neither a lane nor a sublane tile."""
    step = 50 if value < 1000 else 100
    guesses = sorted(range(step, 2 * value, step), key=lambda g: (abs(g - value), -g))
    return next(g for g in guesses if g % 8)


def find_misaligned_block(m: SourceModule) -> list[Site]:
    sites = []
    for c in _block_constants(m):
        new = round_block(c.value)
        name = _constant_name(m, c)
        sites.append(m.site(c, str(new), hints=(str(c.value),), value=str(new), good=str(c.value),
                            name=name or str(new)))
    return sites


def find_vmem_overallocation(m: SourceModule) -> list[Site]:
    """Blocks scaled up by 2, 4, then 8: the smallest that the VMEM budget refuses is kept."""
    sites = []
    for c in _block_constants(m):
        if c.value < 256:
            continue
        name = _constant_name(m, c)
        ladder = [m.site(c, str(c.value * f), hints=(str(c.value),), value=str(c.value * f),
                         good=str(c.value), name=name or str(c.value * f)) for f in (2, 4, 8)]
        ladder[0].fallbacks = ladder[1:]
        sites.append(ladder[0])
    return sites


def _index_maps(m: SourceModule) -> Iterator[ast.Lambda]:
    for call in m.calls("pl.BlockSpec"):
        candidates = call.args[1:2] + [k.value for k in call.keywords if k.arg == "index_map"]
        for node in candidates:
            if isinstance(node, ast.Lambda) and isinstance(node.body, ast.Tuple):
                yield node


def find_index_map_shift(m: SourceModule) -> list[Site]:
    sites = []
    for lam in _index_maps(m):
        for i, elt in enumerate(lam.body.elts):
            if isinstance(elt, ast.Name):
                site = m.site(elt, f"{elt.id} + 1", var=elt.id, position=str(i))
                site.facts.update(before=m.text(lam), after=m.text(lam).replace(m.text(lam.body),
                                  m.text(lam.body).replace(elt.id, f"{elt.id} + 1", 1), 1))
                sites.append(site)
                break
    return sites


def find_index_map_swap(m: SourceModule) -> list[Site]:
    sites = []
    for lam in _index_maps(m):
        names = [e for e in lam.body.elts if isinstance(e, ast.Name)]
        if len(names) >= 2 and names[0].id != names[1].id:
            a, b = names[:2]
            sites.append(Site([m.replace(a, b.id), m.replace(b, a.id)], lam.lineno,
                              dict(function=m.function_name(lam), line=str(lam.lineno), first=a.id,
                                   second=b.id)))
    return sites


def find_floor_grid(m: SourceModule) -> list[Site]:
    """Only where the dim is not padded to whole blocks first (there a floor grid is harmless)."""
    return [m.site(c, f"{m.text(c.args[0])} // {m.text(c.args[1])}", dim=m.text(c.args[0]),
                   block=m.text(c.args[1]))
            for c in m.calls("pl.cdiv") if len(c.args) == 2
            and not re.search(r"jnp\.pad\(|round_up\(", m.text(m.function_of(c) or m.tree))]


def _kernel_wheres(m: SourceModule) -> Iterator[ast.Call]:
    return (c for c in m.calls("jnp.where") if len(c.args) == 3 and m.in_kernel(c))


def find_drop_mask(m: SourceModule) -> list[Site]:
    return [m.site(c, m.text(c.args[1]), hints=("mask",), cond=m.text(c.args[0]), kept=m.text(c.args[1]),
                   fill=m.text(c.args[2]))
            for c in _kernel_wheres(m)]


def find_python_if_on_traced(m: SourceModule) -> list[Site]:
    sites = []
    for c in _kernel_wheres(m):
        text = f"{m.text(c.args[1])} if {m.text(c.args[0])} else {m.text(c.args[2])}"
        if isinstance(m.parent.get(c), (ast.Attribute, ast.Subscript, ast.BinOp, ast.UnaryOp, ast.Compare)):
            text = f"({text})"
        sites.append(m.site(c, text, cond=m.text(c.args[0])))
    return sites


def _when_blocks(m: SourceModule) -> Iterator[tuple[ast.FunctionDef, ast.expr]]:
    for func in m.nodes(ast.FunctionDef):
        for dec in func.decorator_list:
            if isinstance(dec, ast.Call) and _dotted(dec.func) == "pl.when" and dec.args:
                yield func, dec.args[0]


def _stored_refs(func: ast.FunctionDef) -> list[str]:
    return sorted({_dotted(t.value) for t in ast.walk(func) if isinstance(t, ast.Subscript)
                   and isinstance(t.ctx, ast.Store) and _dotted(t.value)})


def _delete_when_block(m: SourceModule, func: ast.FunctionDef, cond: ast.expr, hints: tuple[str, ...],
                       **facts: str) -> Site | None:
    parent = m.parent.get(func)
    if parent is None or len(getattr(parent, "body", [])) < 2:
        return None  # deleting the only statement would leave an empty body
    first = min(d.lineno for d in func.decorator_list)
    return Site([m.delete_lines(first, func.end_lineno)], first,
                dict(function=m.function_name(func), line=str(first), cond=m.text(cond), **facts),
                hints=(func.name, *hints))


def _in_code(m: SourceModule, name: str, skip: ast.FunctionDef) -> bool:
    """Whether `name` still appears in the code once the block `skip` is deleted."""
    first = min(d.lineno for d in skip.decorator_list)
    rest = "".join(m.lines[:first - 1] + m.lines[skip.end_lineno:])
    return re.search(rf"\b{re.escape(name)}\b", rest) is not None


def find_drop_accumulator_init(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "== 0" in m.text(cond) or "init" in func.name:
            refs = [r for r in _stored_refs(func) if _in_code(m, r, func)]
            if refs:
                sites.append(_delete_when_block(m, func, cond, ("_init", "initiali", "reset", "zeroed", "first step"),
                                                refs=", ".join(f"`{r}`" for r in refs), ref=refs[0]))
    return [s for s in sites if s]


def find_drop_finalize(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "num_programs" in m.text(cond) and "init" not in func.name:
            outs = [r for r in _stored_refs(func) if _in_code(m, r, func)]
            if outs:
                sites.append(_delete_when_block(m, func, cond, ("_finish", "_store", "finali", "last step"),
                                                refs=", ".join(f"`{r}`" for r in outs), ref=outs[0]))
    return [s for s in sites if s]


def find_bf16_accumulation(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("pltpu.VMEM"):
        if len(call.args) == 2 and _dotted(call.args[1]) == "jnp.float32":
            sites.append(m.site(call.args[1], "jnp.bfloat16", hints=("float32", "f32"),
                                where="scratch", decl=m.text(call).replace("jnp.float32", "jnp.bfloat16")))
    for kw in m.nodes(ast.keyword):
        if kw.arg == "preferred_element_type" and _dotted(kw.value) == "jnp.float32":
            sites.append(m.site(kw.value, "jnp.bfloat16", hints=("float32", "f32"), where="dot",
                                decl="preferred_element_type=jnp.bfloat16"))
    return sites


def find_no_running_max(m: SourceModule) -> list[Site]:
    return [m.site(c, f"jnp.exp({m.text(c.args[0].left)})", hints=("max", "overflow"),
                   shift=m.text(c.args[0].right), x=m.text(c.args[0].left))
            for c in m.calls("jnp.exp")
            if len(c.args) == 1 and isinstance(c.args[0], ast.BinOp) and isinstance(c.args[0].op, ast.Sub)
            and m.in_kernel(c)]


_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def find_off_by_one_comparison(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.Compare):
        if len(node.ops) == 1 and type(node.ops[0]) in _FLIP and m.in_kernel(node):
            new_op = _SYMBOL[_FLIP[type(node.ops[0])]]
            after = f"{m.text(node.left)} {new_op} {m.text(node.comparators[0])}"
            sites.append(m.site(node, after, op=_SYMBOL[type(node.ops[0])], new_op=new_op))
    return sites


def find_dma_never_waited(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.Expr):
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "wait"
                and len(getattr(m.parent.get(node), "body", [])) >= 2):
            sites.append(Site([m.delete_lines(node.lineno, node.end_lineno)], node.lineno,
                              dict(function=m.function_name(node), line=str(node.lineno),
                                   copy=m.text(call.func.value)), hints=("wait",)))
    return sites


def find_double_buffer_race(m: SourceModule) -> list[Site]:
    return [m.site(node, m.text(node.right), hints=("other slot", "other buffer"), slot=m.text(node.right))
            for node in m.nodes(ast.BinOp)
            if isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Constant) and node.left.value == 1
            and "slot" in m.text(node.right)]


def find_no_parallel_axis(m: SourceModule) -> list[Site]:
    if "parallel_grid" not in m.task.required_features:
        return []  # elsewhere "arbitrary" everywhere is slower on megacore, not wrong
    sites = []
    for kw in m.nodes(ast.keyword):
        if kw.arg == "dimension_semantics" and isinstance(kw.value, ast.Tuple):
            n = len(kw.value.elts)
            sites.append(m.site(kw.value, "(" + ", ".join(['"arbitrary"'] * n) + ("," if n == 1 else "") + ")",
                                hints=("parallel",)))
    return sites


_KWARG_TYPOS = {
    "out_shape": "out_shapes", "in_specs": "input_specs", "out_specs": "output_specs",
    "scratch_shapes": "scratch", "grid": "grid_size", "compiler_params": "compiler_param",
    "dimension_semantics": "dimension_semantic", "block_shape": "block_size", "index_map": "index_fn",
    "grid_spec": "gridspec", "num_scalar_prefetch": "num_prefetch",
}
_KWARG_OWNERS = ("pl.pallas_call", "pl.BlockSpec", "pltpu.CompilerParams", "pltpu.PrefetchScalarGridSpec")


def find_wrong_pallas_kwarg(m: SourceModule) -> list[Site]:
    sites = []
    for owner in _KWARG_OWNERS:
        for call in m.calls(owner):
            for kw in call.keywords:
                if kw.arg in _KWARG_TYPOS:
                    wrong = _KWARG_TYPOS[kw.arg]
                    edit = Edit((kw.lineno, kw.col_offset), (kw.lineno, kw.col_offset + len(kw.arg)), wrong)
                    sites.append(Site([edit], kw.lineno, dict(function=m.function_name(call), line=str(kw.lineno),
                                                              api=owner, kwarg=kw.arg, wrong=wrong)))
    return sites


def find_wrong_out_dtype(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("jax.ShapeDtypeStruct"):
        if len(call.args) == 2:
            old = _dotted(call.args[1]) or m.text(call.args[1])
            new = "jnp.bfloat16" if old == "jnp.float32" else "jnp.float32"
            sites.append(m.site(call.args[1], new, old=m.text(call.args[1]), new=new))
    return sites


def find_unsupported_op(m: SourceModule) -> list[Site]:
    """Reductions written through ops Mosaic cannot lower (a sort, a cumulative sum)."""
    sites = []
    for name, rewrite in (("jnp.max", "jnp.sort({x}, axis={axis})[..., -1:]"),
                          ("jnp.sum", "jnp.cumsum({x}, axis={axis})[..., -1:]")):
        for call in m.calls(name):
            kws = {k.arg: m.text(k.value) for k in call.keywords}
            if (len(call.args) == 1 and m.in_kernel(call) and kws.get("keepdims") == "True"
                    and kws.get("axis") in ("-1", "1")):
                new = rewrite.format(x=m.text(call.args[0]), axis=kws["axis"])
                sites.append(m.site(call, new, op=new.split("(")[0], reduction=name))
    return sites


def find_scalar_store(m: SourceModule) -> list[Site]:
    """A block's reduction stored as one scalar element: Mosaic cannot store scalars to VMEM."""
    sites = []
    for node in m.nodes(ast.Assign):
        target = node.targets[0]
        if not (isinstance(target, ast.Subscript) and _dotted(target.value).endswith("_ref") and m.in_kernel(node)
                and node.lineno == node.end_lineno):
            continue
        for call in ast.walk(node.value):
            if isinstance(call, ast.Call) and _dotted(call.func) in ("jnp.sum", "jnp.max") and len(call.args) == 1 \
                    and any(k.arg == "keepdims" for k in call.keywords):
                ref = _dotted(target.value)
                value = m.text(node.value).replace(m.text(call), f"{_dotted(call.func)}({m.text(call.args[0])})", 1)
                after = f"{ref}[0, 0] = {value}"
                sites.append(m.site(node, after, hints=("keepdims",), ref=ref,
                                    reduction=_dotted(call.func)))
                break
    return sites


TRUNCATION_MARK = "# <answer ends here>"


def find_truncated_answer(m: SourceModule) -> list[Site]:
    """The answer runs out of tokens: it stops mid-line, late in the module, with the code fence
    still open, as a length-capped generation does."""
    code = [i for i, line in enumerate(m.lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    if len(code) < 10:
        return []
    sites = []
    for share in (0.7, 0.85):
        line = next(n for n in code[int(len(code) * share):] + code
                    if len(re.findall(r"\w+", m.lines[n - 1])) >= 4)
        text = m.lines[line - 1].rstrip("\n")
        words = [mt.end() for mt in re.finditer(r"\w+", text)]
        cut = words[len(words) // 2]
        sites.append(Site([Edit((line, len(text[:cut].encode())), (len(m.lines) + 1, 0), TRUNCATION_MARK)], line,
                          dict(function=_function_at(m, line), line=str(line), last=text[:cut].strip()),
                          tidy=False))
    return sites


def _function_at(m: SourceModule, line: int) -> str:
    inner = [f for f in m.nodes(ast.FunctionDef) if f.lineno <= line <= f.end_lineno]
    return max(inner, key=lambda f: f.lineno).name if inner else "<module>"


def find_interpret_flag(m: SourceModule) -> list[Site]:
    sites = []
    for c in m.calls("pl.pallas_call"):
        last = (c.args + [k for k in c.keywords])[-1]
        end = last.value if isinstance(last, ast.keyword) else last
        head = m.lines[last.lineno - 1][:last.col_offset]
        rest = m.lines[end.end_lineno - 1].encode()[end.end_col_offset:].decode()
        if not head.strip() and rest.strip() == ",":  # one argument per line: add a line like them
            edit = Edit((end.end_lineno + 1, 0), (end.end_lineno + 1, 0), f"{head}interpret=True,\n")
            line = end.end_lineno + 1
        else:
            edit = Edit((end.end_lineno, end.end_col_offset), (end.end_lineno, end.end_col_offset), ", interpret=True")
            line = end.end_lineno
        sites.append(Site([edit], line, dict(function=m.function_name(c), line=str(line))))
    return sites


_HALLUCINATED = ["tpu_ops", "mosaic_tpu", "tpu_primitives"]


def find_hallucinated_import(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.ImportFrom):
        if node.module == "jax.experimental.pallas" and any(a.name == "tpu" for a in node.names):
            fake = _stable_pick(_HALLUCINATED, m.task.name)
            new = m.text(node).replace("import tpu", f"import {fake}")
            sites.append(m.site(node, new, module=f"jax.experimental.pallas.{fake}", fake=fake))
    return sites


def find_api_drift(m: SourceModule) -> list[Site]:
    """Names and argument orders from older Pallas releases, or made up from them."""
    sites = []
    for call in m.calls("pltpu.CompilerParams"):
        sites.append(m.site(call.func, "pltpu.TPUCompilerParams", kind="compiler_params",
                            old="pltpu.TPUCompilerParams", new="pltpu.CompilerParams"))
    for node in m.nodes(ast.Attribute):
        if _dotted(node) in ("pl.ANY", "pltpu.ANY"):
            sites.append(m.site(node, "pltpu.TPUMemorySpace.ANY", kind="memory_space",
                                old="pltpu.TPUMemorySpace.ANY", new=_dotted(node)))
    for call in m.calls("pl.BlockSpec"):
        if len(call.args) == 2 and isinstance(call.args[1], ast.Lambda) and not call.keywords:
            shape, index_map = (m.text(a) for a in call.args)
            sites.append(Site([m.replace(call.args[0], index_map), m.replace(call.args[1], shape)], call.lineno,
                              dict(function=m.function_name(call), line=str(call.lineno), kind="blockspec_order",
                                   shape=shape, after=f"pl.BlockSpec({index_map}, {shape})")))
    return sites


def find_program_id_axis(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("pl.program_id"):
        arg = call.args[0] if call.args else None
        if isinstance(arg, ast.Constant) and type(arg.value) is int and arg.value > 0:
            sites.append(m.site(arg, str(arg.value - 1), axis=str(arg.value), wrong=str(arg.value - 1)))
    return sites


def find_program_id_branch(m: SourceModule) -> list[Site]:
    """`@pl.when(cond) def f(): ...` written as `if cond:`: a Python branch on a traced index."""
    sites = []
    for func, cond in _when_blocks(m):
        if len(func.decorator_list) != 1 or any(isinstance(n, ast.Name) and n.id == func.name
                                                for n in m.all_nodes):
            continue
        dec = func.decorator_list[0]
        indent = m.lines[dec.lineno - 1][:dec.col_offset - 1]
        header = Edit((dec.lineno, 0), (func.body[0].lineno, 0), f"{indent}if {m.text(cond)}:\n")
        sites.append(Site([header], dec.lineno, dict(function=m.function_name(func), line=str(dec.lineno),
                                                     cond=m.text(cond))))
    return sites


def find_overwrite_accumulator(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.AugAssign):
        if isinstance(node.op, ast.Add) and isinstance(node.target, ast.Subscript) and m.in_kernel(node):
            target = m.text(node.target)
            after = m.text(node).replace(f"{target} +=", f"{target} =", 1)
            if after != m.text(node):
                sites.append(m.site(node, after, hints=("accumulat",), acc=_dotted(node.target.value)))
    return sites


def find_missing_scale(m: SourceModule) -> list[Site]:
    """A factor named scale left out of the arithmetic: the softmax scale, a dequantisation scale."""
    sites = []
    for node in m.nodes(ast.BinOp):
        if isinstance(node.op, ast.Mult) and m.in_kernel(node):
            for keep, drop in ((node.left, node.right), (node.right, node.left)):
                if "scale" in m.text(drop) and "scale" not in m.text(keep) and len(m.text(drop)) < 40:
                    sites.append(m.site(node, m.text(keep), hints=("scale",), factor=m.text(drop),
                                        kept=m.text(keep)))
                    break
    return sites


def find_wrong_derivative(m: SourceModule) -> list[Site]:
    """A backward kernel missing a term of its derivative: the softmax `- delta`, or the second
    term of a product rule."""
    if "bwd" not in m.task.name:
        return []
    sites = []
    for node in m.nodes(ast.BinOp):
        if not (isinstance(node.op, (ast.Sub, ast.Add)) and m.in_kernel(node)):
            continue
        parent = m.parent.get(node)
        target = parent.targets[0] if isinstance(parent, ast.Assign) else None
        grad = isinstance(target, ast.Name) and "grad" in target.id
        if (isinstance(node.op, ast.Sub) and "delta" in m.text(node.right)) or grad:
            sites.append(m.site(node, m.text(node.left), hints=("- delta", "dp - ") if not grad else ("product rule",),
                                term=m.text(node.right), kept=m.text(node.left),
                                target=target.id if grad else ""))
    return sites


def _pallas_keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _keyword_edit(m: SourceModule, kw: ast.keyword) -> Edit:
    """Delete `kw=value,` and, when it had the line to itself, the line."""
    line = m.lines[kw.lineno - 1]
    end_line = m.lines[kw.value.end_lineno - 1]
    rest = end_line.encode()[kw.value.end_col_offset:].decode()
    if line[:kw.col_offset].strip() == "" and rest.strip() in (",", ""):
        return m.delete_lines(kw.lineno, kw.value.end_lineno)
    tail = len(rest) - len(rest.lstrip(", "))
    end = (kw.value.end_lineno, kw.value.end_col_offset + len(rest[:tail].encode()))
    if not rest[tail:].strip():  # the next argument starts on the next line: join it here
        following = m.lines[kw.value.end_lineno]
        end = (kw.value.end_lineno + 1, len(following) - len(following.lstrip()))
    return Edit((kw.lineno, kw.col_offset), end, "")


def find_whole_array_block(m: SourceModule) -> list[Site]:
    """No grid and no BlockSpecs: every operand becomes one VMEM block, which overflows VMEM at
    the large sizes (how real kernels most often run out of VMEM)."""
    sites = []
    for call in m.calls("pl.pallas_call"):
        keywords = [_pallas_keyword(call, k) for k in ("grid", "in_specs", "out_specs")]
        if None in keywords or _pallas_keyword(call, "scratch_shapes") or _pallas_keyword(call, "grid_spec"):
            continue
        kernel = m.kernel_of(call)  # this call's kernel (a set's order would vary between runs)
        body = next((f for f in m.nodes(ast.FunctionDef) if f.name == kernel), None)
        if body is None or "program_id" in m.text(body) or "num_programs" in m.text(body):
            continue
        edits = [_keyword_edit(m, k) for k in keywords]
        for params in (c for c in ast.walk(call) if _dotted(getattr(c, "func", None)) == "pltpu.CompilerParams"):
            semantics = _pallas_keyword(params, "dimension_semantics")
            if semantics is not None:
                edits.append(_keyword_edit(m, semantics))
        sites.append(Site(edits, call.lineno, dict(function=m.function_name(call), line=str(call.lineno)),
                          hints=("grid", "block", "tile", "step")))
    return sites


def find_unsliced_padding(m: SourceModule) -> list[Site]:
    """The wrapper pads its operands to whole blocks and returns the padded result."""
    sites = []
    for func in m.nodes(ast.FunctionDef):
        if m.in_kernel(func) or "jnp.pad" not in m.text(func):
            continue
        for node in ast.walk(func):
            if (isinstance(node, ast.Return) and isinstance(node.value, ast.Subscript)
                    and isinstance(node.value.slice, (ast.Slice, ast.Tuple))
                    and isinstance(node.value.value, (ast.Name, ast.Call))):
                sites.append(m.site(node.value, m.text(node.value.value), hints=("slice", "padd"),
                                    padded=m.text(node.value.value), sliced=m.text(node.value)))
    return sites


def find_block_rank_mismatch(m: SourceModule) -> list[Site]:
    """A BlockSpec missing a leading dim (the batch or head axis forgotten), in its block shape
    and its index map alike."""
    sites = []
    for call in m.calls("pl.BlockSpec"):
        if len(call.args) != 2 or not isinstance(call.args[0], ast.Tuple):
            continue
        shape, index_map = call.args
        if (len(shape.elts) >= 2 and isinstance(index_map, ast.Lambda) and isinstance(index_map.body, ast.Tuple)
                and len(index_map.body.elts) == len(shape.elts)):
            new_shape = ", ".join(m.text(e) for e in shape.elts[1:]) + ("," if len(shape.elts) == 2 else "")
            new_map = ", ".join(m.text(e) for e in index_map.body.elts[1:]) + ("," if len(shape.elts) == 2 else "")
            sites.append(Site([m.replace(shape, f"({new_shape})"), m.replace(index_map.body, f"({new_map})")],
                              call.lineno, dict(function=m.function_name(call), line=str(call.lineno),
                                                shape=f"({new_shape})", rank=str(len(shape.elts) - 1),
                                                full_rank=str(len(shape.elts)))))
    return sites


_WHOLE_FILE = "(the whole module)"


def find_plain_jax(m: SourceModule) -> list[Site]:
    """The model gives up on Pallas and answers with the reference in jax.numpy."""
    source = reference_source(m.task).replace("def reference(", "def kernel(")
    return [Site([Edit((1, 0), (len(m.lines) + 1, 0), source)], 1, dict(function="kernel", line="1"), tidy=False)]


_COPY_WRAPPER = '''

def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _through_pallas(y):
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype))(y)


def kernel(*args):
    return jax.tree.map(_through_pallas, reference(*args))
'''


def find_copy_kernel_shortcut(m: SourceModule) -> list[Site]:
    """The model computes the answer in jax.numpy and passes it through a copy kernel."""
    header = "import jax\nfrom jax.experimental import pallas as pl\n"
    source = header + reference_source(m.task) + _COPY_WRAPPER
    return [Site([Edit((1, 0), (len(m.lines) + 1, 0), source)], 1, dict(function="kernel", line="1"), tidy=False)]


# --- the operators -------------------------------------------------------------------------------

OPERATORS: tuple[BugOperator, ...] = (
    BugOperator("misaligned_block", "a block size a person would pick (100, 250, 1000) that is not a "
                "multiple of (8, 128)", find_misaligned_block, "static"),
    BugOperator("vmem_overallocation", "blocks just large enough to overflow VMEM at the bench sizes",
                find_vmem_overallocation, "static"),
    BugOperator("whole_array_block", "no grid and no BlockSpecs: whole arrays as single VMEM blocks",
                find_whole_array_block, "static"),
    BugOperator("index_map_shift", "an index_map off by one block (out of range on the last step)",
                find_index_map_shift),
    BugOperator("index_map_swap", "index_map returns grid indices in the wrong order", find_index_map_swap),
    BugOperator("floor_grid", "grid size by floor division: the ragged last block is never computed",
                find_floor_grid),
    BugOperator("drop_mask", "masking of ragged edges or hidden positions left out", find_drop_mask),
    BugOperator("python_if_on_traced", "a Python conditional expression on a traced value",
                find_python_if_on_traced, "static"),
    BugOperator("program_id_branch", "`if pl.program_id(...) == 0:` instead of `pl.when`",
                find_program_id_branch, "static"),
    BugOperator("drop_accumulator_init", "accumulator never initialized at the first reduction step",
                find_drop_accumulator_init),
    BugOperator("drop_finalize", "the accumulator is never stored to the output", find_drop_finalize),
    # Static: on TPU a bfloat16 accumulator fails at tracing (a float32 store into it) or at
    # lowering (the MXU accumulates in 32 bits) before any precision is lost.
    BugOperator("bf16_accumulation", "a bfloat16 accumulator or matmul result type", find_bf16_accumulation,
                "static"),
    BugOperator("no_running_max", "softmax exponent without subtracting the (running) max",
                find_no_running_max),
    BugOperator("off_by_one_comparison", "a mask or causal condition off by one (< vs <=)",
                find_off_by_one_comparison),
    BugOperator("dma_never_waited", "a DMA started but never waited", find_dma_never_waited, priority=0),
    BugOperator("double_buffer_race", "prefetch into the buffer slot being read (race)",
                find_double_buffer_race, priority=0),
    BugOperator("no_parallel_axis", "every grid axis marked arbitrary (no megacore parallelism)",
                find_no_parallel_axis, "static", priority=0),
    BugOperator("wrong_pallas_kwarg", "a misspelled keyword argument to a Pallas API", find_wrong_pallas_kwarg,
                "surface"),
    BugOperator("api_drift", "a Pallas name or argument order from an older release", find_api_drift,
                "static"),
    BugOperator("wrong_out_dtype", "output declared with the wrong dtype", find_wrong_out_dtype),
    BugOperator("unsupported_op", "a sort or cumsum inside the kernel, which Mosaic cannot lower",
                find_unsupported_op, "static"),
    BugOperator("scalar_store", "a reduction stored as one scalar element of a VMEM ref", find_scalar_store,
                "static"),
    BugOperator("block_rank_mismatch", "a BlockSpec missing the leading (batch or head) dim",
                find_block_rank_mismatch, "static"),
    BugOperator("unsliced_padding", "padded result returned without slicing back to the true size",
                find_unsliced_padding),
    BugOperator("missing_scale", "a scale factor left out of the arithmetic", find_missing_scale),
    BugOperator("wrong_derivative", "a backward kernel missing a term of its derivative", find_wrong_derivative),
    BugOperator("truncated_answer", "the answer stops mid-line, out of tokens", find_truncated_answer,
                "surface"),
    BugOperator("interpret_flag", "`interpret=True` left in pallas_call", find_interpret_flag, "surface"),
    BugOperator("hallucinated_import", "importing a Pallas module that does not exist", find_hallucinated_import,
                "surface"),
    BugOperator("program_id_axis", "pl.program_id on the wrong grid axis", find_program_id_axis),
    BugOperator("overwrite_accumulator", "accumulator assigned instead of accumulated",
                find_overwrite_accumulator),
    BugOperator("plain_jax", "no Pallas at all: the reference in jax.numpy", find_plain_jax, "surface"),
    BugOperator("copy_kernel_shortcut", "the work done in jax.numpy, then passed through a copy kernel",
                find_copy_kernel_shortcut, "surface"),
)

OPERATOR_NAMES = tuple(op.name for op in OPERATORS)
COMPOUND = "compound"


def operator(name: str) -> BugOperator:
    for op in OPERATORS:
        if op.name == name:
            return op
    raise KeyError(f"unknown bug operator {name!r}; known: {', '.join(OPERATOR_NAMES)}")


def mutants(task: Task, operators: tuple[BugOperator, ...] = OPERATORS, kernel: str | None = None,
            variant: str = "solution", variant_key: str = "") -> list[Mutant]:
    """Every mutant of a correct kernel of `task` (its solution unless `kernel`, a source, is
    given), in operator order; unchanged or duplicate sources dropped."""
    module = SourceModule(task.solution_source() if kernel is None else kernel, task)
    out, seen = [], {module.source}
    for op in operators:
        for index, site in enumerate(op.find(module)):
            mutant = _mutant(module, op.name, index, site, variant, variant_key)
            if mutant.source in seen or (_spans_lines(site) and not _parses(mutant)):
                continue
            seen.add(mutant.source)
            out.append(mutant)
    return out


def _spans_lines(site: Site) -> bool:
    """Edits within one line keep the module parseable; others are checked (parsing every
    mutant costs as much as making it)."""
    return any(e.start[0] != e.end[0] or "\n" in e.text for e in site.edits)


def _parses(mutant: Mutant) -> bool:
    """A bug is in the code, not in its syntax (a truncated answer aside)."""
    if mutant.operator == "truncated_answer":
        return True
    try:
        parse_module(mutant.source)
    except SyntaxError:
        return False
    return True


def _mutant(module: SourceModule, op: str, index: int, site: Site, variant: str, key: str) -> Mutant:
    source, (facts,) = module.apply(site)
    fallbacks = tuple(_mutant(module, op, index, s, variant, key) for s in site.fallbacks)
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
    source, (facts_a, facts_b) = module.apply(a, b)
    parts = tuple(_mutant(module, op.name, k, site, variant, variant_key) for op, k, site in ((op_a, i, a), (op_b, j, b)))
    combined = Mutant(module.task.name, COMPOUND, index, source, int(facts_a["line"]), {}, variant, variant_key,
                      parts=(replace(parts[0], facts=facts_a, line=int(facts_a["line"])),
                             replace(parts[1], facts=facts_b, line=int(facts_b["line"]))))
    return combined if all(map(_parses, (combined, *parts))) else None


def _near(a: Site, b: Site) -> bool:
    """Whether two sites' edits come within two lines of each other."""
    lines = {n for e in a.edits for n in range(e.start[0] - 2, e.end[0] + 3)}
    return any(e.start[0] in lines or e.end[0] in lines for e in b.edits)
