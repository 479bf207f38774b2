"""Bug operators: inject the mistakes models really make in Pallas TPU kernels into a verified kernel.

The kernels are a task's solution and its verified variants (data_gen/pool.py). Each operator
finds its sites on the kernel's AST and rewrites only that node's source span, so the rest of the
file (comments included) is untouched and the repair is the original kernel. An operator only
proposes a bug; the evaluator decides whether the mutant really fails, and a mutant that still
passes is dropped. Every site carries `facts` (the function, the line, the code before and after)
that the explanation quotes, so no two explanations are the same boilerplate.

The list of operators is `OPERATORS` at the bottom; docs/data-generation.md has the table.
"""
from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from chat.prompts import reference_source
from evaluator.policy import parse_module
from tasks.spec import Task


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (ast positions: 1-based line, 0-based column) with `text`."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str


@dataclass
class Site:
    """One place an operator can inject its bug, and the facts an explanation quotes."""

    edits: list[Edit]
    line: int
    facts: dict[str, str] = field(default_factory=dict)


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


# Expressions that bind more loosely than the context they may replace a node in: a rewrite
# into one of these contexts needs parentheses to keep its meaning (and to parse at all).
_LOOSE_EXPRESSIONS = (ast.IfExp, ast.Lambda, ast.BoolOp, ast.NamedExpr, ast.BinOp, ast.Compare)
_TIGHT_CONTEXTS = (ast.Attribute, ast.Subscript, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp,
                   ast.Await, ast.Starred)


class SourceModule:
    """A solution's source with its AST, parent links and which functions are kernel bodies."""

    def __init__(self, source: str, task: Task):
        self.source, self.task = source, task
        self.tree = parse_module(source)
        self.lines = source.splitlines(keepends=True)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.kernel_names = self._kernel_names()

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

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
        return (n for n in ast.walk(self.tree) if isinstance(n, kind))

    def calls(self, dotted: str) -> Iterator[ast.Call]:
        """Calls whose callee is spelled `dotted`, e.g. 'pl.pallas_call' or 'jnp.where'."""
        return (n for n in self.nodes(ast.Call) if _dotted(n.func) == dotted)

    def replace(self, node: ast.AST, text: str) -> Edit:
        return Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text)

    def delete_lines(self, first: int, last: int) -> Edit:
        return Edit((first, 0), (last + 1, 0), "")

    def site(self, node: ast.AST, replacement: ast.AST | str, **facts: str) -> Site:
        """A one-node rewrite; the facts always include function, line, before and after."""
        after = replacement if isinstance(replacement, str) else ast.unparse(replacement)
        if (isinstance(replacement, _LOOSE_EXPRESSIONS) and type(replacement) is not type(node)
                and isinstance(self.parent.get(node), _TIGHT_CONTEXTS)):
            after = f"({after})"  # `where(c, a, 0).astype(t)` -> `(a if c else 0).astype(t)`
        facts = dict(function=self.function_name(node), line=str(node.lineno), before=self.text(node),
                     after=after, **facts)
        if node.lineno == node.end_lineno:
            facts.setdefault("source_line", self.lines[node.lineno - 1].strip())
        return Site([self.replace(node, after)], node.lineno, facts)

    def apply(self, site: Site) -> str:
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
        for edit in sorted(site.edits, key=lambda e: e.start, reverse=True):
            out = out[:pos(edit.start)] + edit.text + out[pos(edit.end):]
        return out

    def _kernel_names(self) -> set[str]:
        """Functions passed to pl.pallas_call, directly or through functools.partial."""
        partials = {}
        for node in self.nodes(ast.Assign):
            if isinstance(node.value, ast.Call) and _dotted(node.value.func) == "functools.partial":
                for target in node.targets:
                    if isinstance(target, ast.Name) and node.value.args:
                        partials[target.id] = node.value.args[0]
        names = set()
        for call in self.calls("pl.pallas_call"):
            if not call.args:
                continue
            first = call.args[0]
            if isinstance(first, ast.Name) and first.id in partials:
                first = partials[first.id]
            if isinstance(first, ast.Call) and _dotted(first.func) == "functools.partial" and first.args:
                first = first.args[0]
            if isinstance(first, ast.Name):
                names.add(first.id)
        return names


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
    """A kind of bug: where it applies, and what to say about it once the evaluator saw it fail.

    `what` says what is wrong in this kernel, `why_fix` why the original code is right; both are
    format strings over the site's facts.
    """

    name: str
    summary: str
    find: Callable[[SourceModule], list[Site]]
    what: str
    why_fix: str
    # Order in which a task's budget is spent, lowest first: 0 for bugs only a few kernels can have
    # (manual DMA, required features), 1 for the rest. (Edge bugs such as floor_grid were last
    # while the train shapes were aligned and their mutants passed; ragged train cases expose them.)
    priority: int = 1
    # The static stages (through lowering, the VMEM budget and the estimate) show this bug or
    # nothing does: its mutants are graded through them only, and one that passes them is
    # dropped as survived without running its cases (a survivor costs a full grading).
    static: bool = False


# --- site finders, one per operator --------------------------------------------------------------

_BLOCK_CONSTANTS = range(128, 4097, 128)


def _block_constants(m: SourceModule) -> Iterator[ast.Constant]:
    """Integer literals that look like block sizes: multiples of 128, outside index maps."""
    for node in m.nodes(ast.Constant):
        if type(node.value) is int and node.value in _BLOCK_CONSTANTS and not isinstance(
                m.parent.get(node), (ast.Tuple, ast.Lambda, ast.Subscript)):
            yield node


def find_misaligned_block(m: SourceModule) -> list[Site]:
    return [m.site(c, str(c.value - 28), const=str(c.value), new=str(c.value - 28))
            for c in _block_constants(m)]


def find_vmem_overallocation(m: SourceModule) -> list[Site]:
    return [m.site(c, str(c.value * 16), const=str(c.value), new=str(c.value * 16))
            for c in _block_constants(m) if c.value >= 256]


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
                new = ast.Lambda(lam.args, ast.Tuple([*lam.body.elts[:i], ast.BinOp(elt, ast.Add(), ast.Constant(1)),
                                                      *lam.body.elts[i + 1:]], ast.Load()))
                sites.append(m.site(lam, new, var=elt.id, position=str(i)))
                break
    return sites


def find_index_map_swap(m: SourceModule) -> list[Site]:
    sites = []
    for lam in _index_maps(m):
        names = [i for i, e in enumerate(lam.body.elts) if isinstance(e, ast.Name)]
        if len(names) >= 2 and lam.body.elts[names[0]].id != lam.body.elts[names[1]].id:
            elts = list(lam.body.elts)
            a, b = names[:2]
            elts[a], elts[b] = elts[b], elts[a]
            sites.append(m.site(lam, ast.Lambda(lam.args, ast.Tuple(elts, ast.Load())),
                                first=lam.body.elts[a].id, second=lam.body.elts[b].id))
    return sites


def find_floor_grid(m: SourceModule) -> list[Site]:
    return [m.site(c, ast.BinOp(c.args[0], ast.FloorDiv(), c.args[1]))
            for c in m.calls("pl.cdiv") if len(c.args) == 2]


def _kernel_wheres(m: SourceModule) -> Iterator[ast.Call]:
    return (c for c in m.calls("jnp.where") if len(c.args) == 3 and m.in_kernel(c))


def find_drop_mask(m: SourceModule) -> list[Site]:
    return [m.site(c, c.args[1], cond=m.text(c.args[0]), kept=m.text(c.args[1]), fill=m.text(c.args[2]))
            for c in _kernel_wheres(m)]


def find_python_if_on_traced(m: SourceModule) -> list[Site]:
    return [m.site(c, ast.IfExp(c.args[0], c.args[1], c.args[2]), cond=m.text(c.args[0]))
            for c in _kernel_wheres(m)]


def _when_blocks(m: SourceModule) -> Iterator[tuple[ast.FunctionDef, ast.expr]]:
    for func in m.nodes(ast.FunctionDef):
        for dec in func.decorator_list:
            if isinstance(dec, ast.Call) and _dotted(dec.func) == "pl.when" and dec.args:
                yield func, dec.args[0]


def _delete_when_block(m: SourceModule, func: ast.FunctionDef, cond: ast.expr, **facts: str) -> Site | None:
    parent = m.parent.get(func)
    if parent is None or len(getattr(parent, "body", [])) < 2:
        return None  # deleting the only statement would leave an empty body
    first = min(d.lineno for d in func.decorator_list)
    body = "".join(m.lines[first - 1:func.end_lineno])
    return Site([m.delete_lines(first, func.end_lineno)], first,
                dict(function=m.function_name(func), line=str(first), block=func.name,
                     cond=m.text(cond), before=body.rstrip(), after="(removed)", **facts))


def find_drop_accumulator_init(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "== 0" in m.text(cond) or "init" in func.name:
            refs = sorted({_dotted(t.value) for t in ast.walk(func) if isinstance(t, ast.Subscript)
                           and isinstance(t.ctx, ast.Store)})
            sites.append(_delete_when_block(m, func, cond, refs=", ".join(f"`{r}`" for r in refs)))
    return [s for s in sites if s]


def find_drop_finalize(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "num_programs" in m.text(cond) and "init" not in func.name:
            outs = sorted({_dotted(t.value) for t in ast.walk(func) if isinstance(t, ast.Subscript)
                           and isinstance(t.ctx, ast.Store)})
            sites.append(_delete_when_block(m, func, cond, refs=", ".join(f"`{r}`" for r in outs)))
    return [s for s in sites if s]


def find_bf16_accumulation(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("pltpu.VMEM"):
        if len(call.args) == 2 and _dotted(call.args[1]) == "jnp.float32":
            sites.append(m.site(call.args[1], "jnp.bfloat16", where="the VMEM scratch buffer "
                                f"`{m.text(call)}`"))
    for kw in m.nodes(ast.keyword):
        if kw.arg == "preferred_element_type" and _dotted(kw.value) == "jnp.float32":
            sites.append(m.site(kw.value, "jnp.bfloat16", where="the MXU result type "
                                "(`preferred_element_type`)"))
    return sites


def find_no_running_max(m: SourceModule) -> list[Site]:
    return [m.site(c, ast.Call(c.func, [c.args[0].left], []), shift=m.text(c.args[0].right))
            for c in m.calls("jnp.exp")
            if len(c.args) == 1 and isinstance(c.args[0], ast.BinOp) and isinstance(c.args[0].op, ast.Sub)
            and m.in_kernel(c)]


_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def find_off_by_one_comparison(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.Compare):
        if len(node.ops) == 1 and type(node.ops[0]) in _FLIP and m.in_kernel(node):
            new_op = _FLIP[type(node.ops[0])]
            sites.append(m.site(node, ast.Compare(node.left, [new_op()], node.comparators),
                                op=_SYMBOL[type(node.ops[0])], new_op=_SYMBOL[new_op]))
    return sites


def find_dma_never_waited(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.Expr):
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "wait":
            only_statement = len(getattr(m.parent.get(node), "body", [])) < 2
            edit = m.replace(node, "pass") if only_statement else m.delete_lines(node.lineno, node.end_lineno)
            sites.append(Site([edit], node.lineno,
                              dict(function=m.function_name(node), line=str(node.lineno),
                                   before=m.text(node), after="(removed)", copy=m.text(call.func.value))))
    return sites


def find_double_buffer_race(m: SourceModule) -> list[Site]:
    return [m.site(node, node.right, slot=m.text(node.right))
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
            sites.append(m.site(kw.value, "(" + ", ".join(['"arbitrary"'] * n) + ("," if n == 1 else "") + ")"))
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
                    site = m.site(kw, f"{wrong}={m.text(kw.value)}", api=owner, kwarg=kw.arg, wrong=wrong)
                    site.facts["before"] = f"{kw.arg}=..."
                    site.facts["after"] = f"{wrong}=..."
                    sites.append(site)
    return sites


def find_wrong_out_dtype(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("jax.ShapeDtypeStruct"):
        if len(call.args) == 2:
            old = _dotted(call.args[1])
            new = "jnp.bfloat16" if old == "jnp.float32" else "jnp.float32"
            sites.append(m.site(call.args[1], new, old=m.text(call.args[1]), new=new))
    return sites


def find_unsupported_op(m: SourceModule) -> list[Site]:
    """Reductions rewritten through ops Mosaic cannot lower (a sort, a cumulative sum)."""
    sites = []
    for name, rewrite in (("jnp.max", "jnp.sort({x}, axis={axis})[..., -1:]"),
                          ("jnp.sum", "jnp.cumsum({x}, axis={axis})[..., -1:]")):
        for call in m.calls(name):
            kws = {k.arg: m.text(k.value) for k in call.keywords}
            if (len(call.args) == 1 and m.in_kernel(call) and kws.get("keepdims") == "True"
                    and kws.get("axis") in ("-1", "1")):
                new = rewrite.format(x=m.text(call.args[0]), axis=kws["axis"])
                sites.append(m.site(call, new, op=new.split("(")[0]))
    return sites


TRUNCATION_MARK = "# <answer ends here>"


def find_truncated_answer(m: SourceModule) -> list[Site]:
    """The answer stops inside the pallas_call, as when a model runs out of tokens: once with the
    code fence left open (nothing to extract), once closed (nothing that parses)."""
    sites = []
    for call in m.calls("pl.pallas_call"):
        node = m.parent.get(call)
        if node is not None and node.end_lineno - node.lineno >= 3:
            cut = node.lineno + (node.end_lineno - node.lineno) // 2
            for fence_open in (True, False):
                tail = TRUNCATION_MARK if fence_open else ""
                sites.append(Site([Edit((cut + 1, 0), (len(m.lines) + 1, 0), tail)], cut,
                                  dict(function=m.function_name(call), line=str(cut), start=str(node.lineno),
                                       before=m.text(node), after="(answer ends here)",
                                       fence=" nor the ```python block" if fence_open else "")))
    return sites


def find_interpret_flag(m: SourceModule) -> list[Site]:
    return [m.site(c, ast.Call(c.func, c.args, [*c.keywords, ast.keyword("interpret", ast.Constant(True))]))
            for c in m.calls("pl.pallas_call")]


_HALLUCINATED = ["tpu_ops", "mosaic_tpu", "tpu_primitives"]


def find_hallucinated_import(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.ImportFrom):
        if node.module == "jax.experimental.pallas" and any(a.name == "tpu" for a in node.names):
            fake = _stable_pick(_HALLUCINATED, m.task.name)
            new = m.text(node).replace("import tpu", f"import {fake}")
            sites.append(m.site(node, new, module=f"jax.experimental.pallas.{fake}"))
    return sites


def find_program_id_axis(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("pl.program_id"):
        arg = call.args[0] if call.args else None
        if isinstance(arg, ast.Constant) and type(arg.value) is int and arg.value > 0:
            sites.append(m.site(arg, str(arg.value - 1), axis=str(arg.value), wrong=str(arg.value - 1)))
    return sites


def find_overwrite_accumulator(m: SourceModule) -> list[Site]:
    sites = []
    for node in m.nodes(ast.AugAssign):
        if isinstance(node.op, ast.Add) and isinstance(node.target, ast.Subscript) and m.in_kernel(node):
            new = ast.Assign([node.target], node.value, lineno=node.lineno)
            sites.append(m.site(node, new, acc=_dotted(node.target.value)))
    return sites


_WHOLE_FILE = "(the whole module)"


def find_plain_jax(m: SourceModule) -> list[Site]:
    """The model gives up on Pallas and answers with the reference in jax.numpy."""
    source = reference_source(m.task).replace("def reference(", "def kernel(")
    return [Site([Edit((1, 0), (len(m.lines) + 1, 0), source)], 1,
                 dict(function="kernel", line="1", before=_WHOLE_FILE, after=_WHOLE_FILE))]


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
    return [Site([Edit((1, 0), (len(m.lines) + 1, 0), source)], 1,
                 dict(function="kernel", line="1", before=_WHOLE_FILE, after=_WHOLE_FILE))]


# --- the operators -------------------------------------------------------------------------------

OPERATORS: tuple[BugOperator, ...] = (
    BugOperator(
        "misaligned_block", "a block size not a multiple of (8, 128)", find_misaligned_block,
        "At line {line} (`{function}`) the block size {const} became {new}. {new} is neither a multiple "
        "of 128 lanes nor of 8 sublanes, and a block's last two dims must be (unless they span the "
        "whole array), so Mosaic cannot tile the block.",
        "With {const} every block is a whole number of (8, 128) tiles again.", static=True),
    BugOperator(
        "vmem_overallocation", "blocks so large they exceed the scoped VMEM budget",
        find_vmem_overallocation,
        "At line {line} (`{function}`) the block size {const} was raised to {new}. At the large shapes "
        "the blocks become huge, and the pipeline double-buffers every input and output block. Their "
        "total exceeds the scoped VMEM limit, so the kernel cannot be allocated.",
        "With {const} the blocks (times two buffers, plus scratch) fit VMEM with room to spare, and "
        "the grid simply takes more steps.", static=True),
    BugOperator(
        "index_map_shift", "an index_map off by one block (out of range on the last step)",
        find_index_map_shift,
        "The index map at line {line} returns `{var} + 1` at position {position} instead of `{var}`. "
        "Index maps return block indices, so every step reads the next block over, and the last "
        "step reads one block past the end of the array.",
        "Returning `{var}` maps grid step {var} to block {var}, so each block is visited exactly once "
        "and none is out of range."),
    BugOperator(
        "index_map_swap", "index_map returns grid indices in the wrong order", find_index_map_swap,
        "The index map at line {line} swaps `{first}` and `{second}`, so the block is fetched from "
        "the wrong place: `{after}` instead of `{before}`.",
        "`{before}` pairs each grid axis with the array axis it tiles."),
    BugOperator(
        "floor_grid", "grid size by floor division: the ragged last block is never computed",
        find_floor_grid,
        "At line {line} the grid size is `{after}`, a floor division. When the dimension is not a "
        "multiple of the block, the last partial block gets no grid step and its outputs are never "
        "written.",
        "`{before}` rounds up, so the grid covers the ragged tail. Pallas masks the out-of-range part "
        "of the last block on write-back."),
    BugOperator(
        "drop_mask", "masking of ragged edges or hidden positions removed", find_drop_mask,
        "At line {line} (`{function}`) the mask `jnp.where({cond}, {kept}, {fill})` was dropped and "
        "`{kept}` is used unmasked. Elements where `{cond}` is false (padding past the true size, or "
        "positions that must stay hidden) now feed into the result.",
        "The `jnp.where` replaces those elements with `{fill}`, so they cannot contribute."),
    BugOperator(
        "python_if_on_traced", "a Python `if` on a traced value inside the kernel",
        find_python_if_on_traced,
        "At line {line} (`{function}`) the kernel uses a Python conditional expression on `{cond}`. "
        "That is a traced array, so Python cannot turn it into a bool while tracing, and the kernel "
        "never lowers.",
        "`jnp.where({cond}, ...)` selects element-wise inside the traced program (for whole blocks of "
        "code, `pl.when` or `lax.cond` do the same)."),
    BugOperator(
        "drop_accumulator_init", "accumulator never initialized at the first reduction step",
        find_drop_accumulator_init,
        "The `@pl.when({cond})` block `{block}` in `{function}` (line {line}) was removed. It reset "
        "{refs} at the first step of the reduction axis. Scratch memory starts with garbage (and "
        "keeps the previous output block's values), so the accumulation starts from the wrong value.",
        "Initializing under `pl.when({cond})` zeroes the accumulator, or sets the running max to "
        "-inf, exactly once per output block, before the first partial result is added."),
    BugOperator(
        "drop_finalize", "the final store of the accumulator removed", find_drop_finalize,
        "The `@pl.when({cond})` block `{block}` in `{function}` (line {line}) was removed. It wrote "
        "{refs} at the last reduction step. Without it the accumulated result is never written, "
        "and the output holds whatever was in the buffer.",
        "The store under `pl.when({cond})` runs once per output block, after the last partial result, "
        "and writes the finished value in the output dtype."),
    BugOperator(
        "bf16_accumulation", "accumulating in bfloat16 instead of float32", find_bf16_accumulation,
        "At line {line} (`{function}`) {where} is bfloat16 instead of float32. bfloat16 keeps 8 bits of "
        "mantissa, so adding many partial products loses precision: the error grows with the "
        "reduction length.",
        "Accumulating in float32 keeps the partial sums exact enough. Cast to the output dtype once, "
        "at the end."),
    BugOperator(
        "no_running_max", "softmax exponent without subtracting the (running) max", find_no_running_max,
        "At line {line} (`{function}`) `{after}` no longer subtracts `{shift}`. Large logits overflow "
        "to inf, and an online softmax that rescales by exp(m_prev - m_new) elsewhere becomes "
        "inconsistent with these unshifted terms.",
        "`{before}` keeps every exponent <= 0 (no overflow) and consistent with the max the running "
        "sum is kept relative to."),
    BugOperator(
        "off_by_one_comparison", "a mask or causal condition off by one (< vs <=)",
        find_off_by_one_comparison,
        "At line {line} (`{function}`) the comparison `{before}` became `{after}` ({op} -> {new_op}). "
        "The boundary element is now on the wrong side: the diagonal of a causal mask, or the last "
        "valid position of a ragged edge.",
        "`{before}` includes exactly the positions the reference includes."),
    BugOperator(
        "dma_never_waited", "a DMA started but never waited", find_dma_never_waited,
        "At line {line} (`{function}`) the `{before}` was removed, so the copy `{copy}` is started but "
        "never waited on. The kernel reads the destination buffer while the DMA may still be "
        "writing it, and the semaphore is left signalled at the kernel's end.",
        "Waiting on the copy before its destination is read makes the data arrive first, and every "
        "started DMA gets exactly one wait.", priority=0),
    BugOperator(
        "double_buffer_race", "prefetch into the buffer slot being read (race)", find_double_buffer_race,
        "At line {line} (`{function}`) the next chunk is prefetched into slot `{slot}`, the slot the "
        "current step is reading (`{after}` instead of `{before}`). The DMA overwrites data while it "
        "is in use.",
        "`{before}` sends the prefetch to the other buffer. The current one stays intact until its "
        "step is done.", priority=0),
    BugOperator(
        "no_parallel_axis", "every grid axis marked arbitrary (no megacore parallelism)",
        find_no_parallel_axis,
        "At line {line} `dimension_semantics` is `{after}`. No grid axis is marked parallel, so the "
        "grid cannot be split across TensorCores on megacore chips, and the task requires a parallel "
        "grid.",
        "`{before}` marks the independent output axes parallel. Only the reduction axis, whose steps "
        "depend on each other, stays arbitrary.", priority=0),
    BugOperator(
        "wrong_pallas_kwarg", "a wrong keyword argument to a Pallas API", find_wrong_pallas_kwarg,
        "At line {line} (`{function}`) `{api}` is called with `{wrong}=`, which it does not accept. The "
        "keyword is `{kwarg}=`.",
        "Using `{api}`'s real keyword `{kwarg}` passes the value where Pallas expects it."),
    BugOperator(
        "wrong_out_dtype", "output declared with the wrong dtype", find_wrong_out_dtype,
        "At line {line} (`{function}`) the output is declared as `{new}` instead of `{old}`. The "
        "kernel's result then has the wrong dtype for some cases, whatever the values.",
        "Declaring `out_shape` with `{old}` gives the dtype the task's signature requires."),
    BugOperator(
        "unsupported_op", "an op inside the kernel that Mosaic cannot lower", find_unsupported_op,
        "At line {line} (`{function}`) the reduction is written as `{after}`. `{op}` has no TPU "
        "(Mosaic) lowering inside a Pallas kernel, so compilation fails even though the math is "
        "right.",
        "`{before}` is a plain reduction, which Mosaic lowers to vector reductions along lanes."),
    BugOperator(
        "truncated_answer", "the answer stops mid-statement (out of tokens)", find_truncated_answer,
        "The answer stops at line {line}, inside the statement that begins at line {start} with "
        "`pl.pallas_call(`. Neither the call{fence} is closed, so there is no complete module to run.",
        "The complete module closes the call, passes the operands and returns the result."),
    BugOperator(
        "interpret_flag", "`interpret=True` left in pallas_call", find_interpret_flag,
        "At line {line} (`{function}`) `pl.pallas_call` is given `interpret=True`. That runs the "
        "kernel as a Python emulation instead of compiling it for the TPU, and graders reject it.",
        "Without `interpret=`, the kernel is compiled for the TPU; the grader chooses interpretation "
        "itself when no TPU is present."),
    BugOperator(
        "hallucinated_import", "importing a Pallas module that does not exist", find_hallucinated_import,
        "Line {line} imports `{module}`, which does not exist, so the module fails on import.",
        "TPU-specific Pallas APIs (VMEM, CompilerParams, DMAs) live in `jax.experimental.pallas.tpu`, "
        "imported as `pltpu`."),
    BugOperator(
        "program_id_axis", "pl.program_id on the wrong grid axis", find_program_id_axis,
        "At line {line} (`{function}`) the kernel reads `pl.program_id({wrong})` where it needs grid "
        "axis {axis}. Its position along the intended axis is now taken from another axis, so "
        "offsets, masks or init/store steps happen at the wrong steps.",
        "`pl.program_id({axis})` is the index along the axis the code reasons about."),
    BugOperator(
        "overwrite_accumulator", "accumulator assigned instead of accumulated",
        find_overwrite_accumulator,
        "At line {line} (`{function}`) `{acc}` is overwritten (`=`) instead of accumulated (`+=`). Only "
        "the last reduction step's partial result survives.",
        "`+=` adds every step's partial result to the accumulator."),
    BugOperator(
        "plain_jax", "no Pallas at all: the reference in jax.numpy", find_plain_jax,
        "The module defines `kernel` as plain jax.numpy code, the reference itself, and never calls "
        "`pl.pallas_call`. Nothing runs as a Pallas kernel.",
        "A real kernel moves the task's arithmetic into `pl.pallas_call`, tiled with BlockSpecs over a "
        "grid."),
    BugOperator(
        "copy_kernel_shortcut", "the work done in jax.numpy, then passed through a copy kernel",
        find_copy_kernel_shortcut,
        "The module computes the whole result with jax.numpy outside any kernel, then passes it "
        "through `_copy_kernel`, a Pallas kernel that only copies. The task's arithmetic never runs "
        "in Pallas.",
        "The corrected module does the arithmetic inside the Pallas kernel body; outside it only "
        "pads, reshapes and slices."),
)

OPERATOR_NAMES = tuple(op.name for op in OPERATORS)


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
            source = module.apply(site)
            if source in seen:
                continue
            seen.add(source)
            out.append(Mutant(task.name, op.name, index, source, site.line, site.facts, variant, variant_key))
    return out
