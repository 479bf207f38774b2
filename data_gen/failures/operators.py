"""Bug operators: the catalogue of mistakes models really make in Pallas TPU kernels, each with
the finder of the sites in a verified kernel where it can be injected.

The kernels are a task's solution and its verified variants (data_gen/pool.py). Each operator
finds its sites on the kernel's AST and proposes a rewrite of only the source text of that site
(data_gen/failures/edits.py writes it in). An operator only proposes a bug; the evaluator decides whether
the mutant really fails, and a mutant that still passes is dropped. Every site carries `facts`
about the failing code (the function, the line, the code as it now reads) for
data_gen/rows/explanations.py to write about. The catalogue is its own module so that adding or
changing a bug touches this file only.

The list of operators is `OPERATORS` at the bottom; docs/data-generation.md has the table.
"""
from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator

from chat.prompts import reference_source
from data_gen.catalogue.kinds import KINDS
from data_gen.failures.edits import (STANDARD_IMPORTS, TRUNCATION_MARK, BugOperator, Edit, Site, SourceModule,
                                     dotted_name)

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
        sites.append(m.site(c, str(new), value=str(new), good=str(c.value),
                            name=name or str(new)))
    return sites


def find_vmem_overallocation(m: SourceModule) -> list[Site]:
    """Blocks scaled up by 2, 4, then 8: the smallest that the VMEM budget refuses is kept."""
    sites = []
    for c in _block_constants(m):
        if c.value < 256:
            continue
        name = _constant_name(m, c)
        ladder = [m.site(c, str(c.value * f), value=str(c.value * f),
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
    return [m.site(c, m.text(c.args[1]), cond=m.text(c.args[0]), kept=m.text(c.args[1]),
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
            if isinstance(dec, ast.Call) and dotted_name(dec.func) == "pl.when" and dec.args:
                yield func, dec.args[0]


def _stored_refs(func: ast.FunctionDef) -> list[str]:
    return sorted({dotted_name(t.value) for t in ast.walk(func) if isinstance(t, ast.Subscript)
                   and isinstance(t.ctx, ast.Store) and dotted_name(t.value)})


def _delete_when_block(m: SourceModule, func: ast.FunctionDef, cond: ast.expr,
                       **facts: str) -> Site | None:
    parent = m.parent.get(func)
    if parent is None or len(getattr(parent, "body", [])) < 2:
        return None  # deleting the only statement would leave an empty body
    first = min(d.lineno for d in func.decorator_list)
    return Site([m.delete_lines(first, func.end_lineno)], first,
                dict(function=m.function_name(func), line=str(first), cond=m.text(cond), **facts))


def _in_code(m: SourceModule, name: str, skip: ast.FunctionDef) -> bool:
    """Whether `name` still appears in the code once the block `skip` is deleted."""
    first = min(d.lineno for d in skip.decorator_list)
    rest = "".join(m.lines[:first - 1] + m.lines[skip.end_lineno:])
    return re.search(rf"\b{re.escape(name)}\b", rest) is not None


def _body_text(m: SourceModule, func: ast.FunctionDef) -> dict[str, str]:
    """The statements of a deleted block as code quoted in one sentence, what the fix writes back:
    all of them when they are short, else the stores into refs, with `more` saying so."""
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    text = "; ".join(" ".join(m.text(s).split()) for s in body)
    if len(text) <= 160 and not any(isinstance(s, (ast.FunctionDef, ast.For, ast.While)) for s in body):
        return dict(body=text, more="")
    stores = [s for s in body if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Subscript)]
    return dict(body="; ".join(" ".join(m.text(s).split()) for s in stores) or text,
                more=", with the computation that block does around it" if stores else "")


def find_drop_accumulator_init(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "== 0" in m.text(cond) or "init" in func.name:
            refs = [r for r in _stored_refs(func) if _in_code(m, r, func)]
            if refs:
                sites.append(_delete_when_block(m, func, cond,
                                                refs=", ".join(f"`{r}`" for r in refs), ref=refs[0],
                                                **_body_text(m, func)))
    return [s for s in sites if s]


def find_drop_finalize(m: SourceModule) -> list[Site]:
    sites = []
    for func, cond in _when_blocks(m):
        if "num_programs" in m.text(cond) and "init" not in func.name:
            outs = [r for r in _stored_refs(func) if _in_code(m, r, func)]
            if outs:
                sites.append(_delete_when_block(m, func, cond,
                                                refs=", ".join(f"`{r}`" for r in outs), ref=outs[0],
                                                **_body_text(m, func)))
    return [s for s in sites if s]


def find_bf16_accumulation(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("pltpu.VMEM"):
        if len(call.args) == 2 and dotted_name(call.args[1]) == "jnp.float32":
            sites.append(m.site(call.args[1], "jnp.bfloat16", where="scratch", decl=m.text(call).replace("jnp.float32", "jnp.bfloat16")))
    for kw in m.nodes(ast.keyword):
        if kw.arg == "preferred_element_type" and dotted_name(kw.value) == "jnp.float32":
            sites.append(m.site(kw.value, "jnp.bfloat16", where="dot",
                                decl="preferred_element_type=jnp.bfloat16"))
    return sites


def find_no_running_max(m: SourceModule) -> list[Site]:
    return [m.site(c, f"jnp.exp({m.text(c.args[0].left)})", shift=m.text(c.args[0].right), x=m.text(c.args[0].left))
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
                                   copy=m.text(call.func.value))))
    return sites


def find_double_buffer_race(m: SourceModule) -> list[Site]:
    return [m.site(node, m.text(node.right), slot=m.text(node.right))
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
                    edit = Edit((kw.lineno, kw.col_offset), (kw.lineno, kw.col_offset + len(kw.arg)), wrong)
                    sites.append(Site([edit], kw.lineno, dict(function=m.function_name(call), line=str(kw.lineno),
                                                              api=owner, kwarg=kw.arg, wrong=wrong)))
    return sites


def find_wrong_out_dtype(m: SourceModule) -> list[Site]:
    sites = []
    for call in m.calls("jax.ShapeDtypeStruct"):
        if len(call.args) == 2:
            old = dotted_name(call.args[1]) or m.text(call.args[1])
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
        if not (isinstance(target, ast.Subscript) and dotted_name(target.value).endswith("_ref") and m.in_kernel(node)
                and node.lineno == node.end_lineno):
            continue
        for call in ast.walk(node.value):
            if isinstance(call, ast.Call) and dotted_name(call.func) in ("jnp.sum", "jnp.max") and len(call.args) == 1 \
                    and any(k.arg == "keepdims" for k in call.keywords):
                ref = dotted_name(target.value)
                value = m.text(node.value).replace(m.text(call), f"{dotted_name(call.func)}({m.text(call.args[0])})", 1)
                after = f"{ref}[0, 0] = {value}"
                sites.append(m.site(node, after, ref=ref,
                                    reduction=dotted_name(call.func)))
                break
    return sites


def find_truncated_answer(m: SourceModule) -> list[Site]:
    """The answer runs out of tokens: it stops mid-line, late in the module, with the code fence
    still open, as a length-capped generation does."""
    docs = {n for node in m.nodes((ast.Module, ast.FunctionDef, ast.ClassDef)) if ast.get_docstring(node) is not None
            for n in range(node.body[0].lineno, node.body[0].end_lineno + 1)}
    code = [i for i, line in enumerate(m.lines, 1)
            if line.strip() and not line.lstrip().startswith("#") and i not in docs]  # a cut in prose would not read as code
    if len(code) < 10:
        return []
    sites = []
    for share in (0.7, 0.85):
        line = next((n for n in code[int(len(code) * share):] + code
                     if len(re.findall(r"\w+", _code_part(m.lines[n - 1]))) >= 4), None)
        if line is None:
            return sites
        text = m.lines[line - 1].rstrip("\n")
        words = [mt.end() for mt in re.finditer(r"\w+", _code_part(text))]
        cut = words[len(words) // 2]
        sites.append(Site([Edit((line, len(text[:cut].encode())), (len(m.lines) + 1, 0), TRUNCATION_MARK)], line,
                          dict(function=_function_at(m, line), line=str(line), last=text[:cut].strip()),
                          tidy=False))
    return sites


def _code_part(line: str) -> str:
    return line.split("#")[0]


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


def _stable_pick(options: list[str], key: str) -> str:
    return options[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(options)]


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
        if dotted_name(node) in ("pl.ANY", "pltpu.ANY"):
            sites.append(m.site(node, "pltpu.TPUMemorySpace.ANY", kind="memory_space",
                                old="pltpu.TPUMemorySpace.ANY", new=dotted_name(node)))
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
                sites.append(m.site(node, after, acc=dotted_name(node.target.value)))
    return sites


def find_missing_scale(m: SourceModule) -> list[Site]:
    """A factor named scale left out of the arithmetic: the softmax scale, a dequantisation scale."""
    sites = []
    for node in m.nodes(ast.BinOp):
        if isinstance(node.op, ast.Mult) and m.in_kernel(node):
            for keep, drop in ((node.left, node.right), (node.right, node.left)):
                if "scale" in m.text(drop) and "scale" not in m.text(keep) and len(m.text(drop)) < 40:
                    sites.append(m.site(node, m.text(keep), factor=m.text(drop),
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
            sites.append(m.site(node, m.text(node.left), term=m.text(node.right), kept=m.text(node.left),
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
        for params in (c for c in ast.walk(call) if dotted_name(getattr(c, "func", None)) == "pltpu.CompilerParams"):
            semantics = _pallas_keyword(params, "dimension_semantics")
            if semantics is not None:
                edits.append(_keyword_edit(m, semantics))
        sites.append(Site(edits, call.lineno, dict(function=m.function_name(call), line=str(call.lineno))))
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
                sites.append(m.site(node.value, m.text(node.value.value), padded=m.text(node.value.value), sliced=m.text(node.value)))
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


def _block_shape_names(m: SourceModule) -> Iterator[tuple[ast.Name, int]]:
    """Names in the last two places of a BlockSpec's block shape, with their place (-2 or -1)."""
    for call in m.calls("pl.BlockSpec"):
        shape = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "block_shape"), None)
        if isinstance(shape, ast.Tuple) and len(shape.elts) >= 2:
            for place in (-2, -1):
                if isinstance(shape.elts[place], ast.Name):
                    yield shape.elts[place], place


def _is_extent(value: ast.expr) -> bool:
    """`x.shape[i]`: one of an operand's dimensions, whole."""
    return (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute)
            and value.value.attr == "shape")


def _block_bindings(m: SourceModule) -> list[tuple[ast.expr, str, int]]:
    """Where each block-size name used by a BlockSpec gets its value, once per binding: the
    right side of a local assignment, or the keyword argument a call passes for a parameter.
    A name bound to an operand's extent (`k = w.shape[0]`) is the whole dimension, not a tile
    size: written as 2048, depthwise_conv2d's filter became 2048 x 2048 taps unrolled, a trace
    that ran into the step limit. Returns (value node, name, place in the block shape)."""
    out, seen = [], set()
    for name, place in _block_shape_names(m):
        func = m.function_of(name)
        if func is None:
            continue
        values = [n.value for n in ast.walk(func) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name.id]
        params = {a.arg for a in func.args.args + func.args.kwonlyargs}
        if not values and name.id in params:
            values = [k.value for c in m.nodes(ast.Call) if dotted_name(c.func) == func.name
                      for k in c.keywords if k.arg == name.id]
        for value in values:
            if not isinstance(value, ast.Constant) and not _is_extent(value) and id(value) not in seen:
                seen.add(id(value))
                out.append((value, name.id, place))
    return out


_ROUND_SIZES = (100, 250, 500, 200, 1000)


def find_literal_block_size(m: SourceModule) -> list[Site]:
    """A block size written as a round literal (100, 250, 500): no multiple of the (8, 128) tile."""
    sites = []
    for value, name, place in _block_bindings(m):
        options = [v for v in _ROUND_SIZES if v % (8 if place == -2 else 128)]
        new = _stable_pick([str(v) for v in options], f"{m.task.name}:{name}:{value.lineno}")
        sites.append(m.site(value, new, name=name, value=new))
    return sites


def find_oversized_block(m: SourceModule) -> list[Site]:
    """A block size written as a large literal, for fewer grid steps: 2048, else 4096, else 8192
    rows, the smallest the VMEM budget refuses at the bench sizes."""
    sites = []
    for value, name, place in _block_bindings(m):
        if place != -2:
            continue
        ladder = [m.site(value, str(v), name=name, value=str(v))
                  for v in (2048, 4096, 8192)]
        ladder[0].fallbacks = ladder[1:]
        sites.append(ladder[0])
    return sites


def find_traced_slice(m: SourceModule) -> list[Site]:
    """`ref[pl.ds(start, size)]` written as a Python slice `ref[start:start + size]`, whose
    bounds are traced values inside the kernel."""
    sites = []
    for call in m.calls("pl.ds"):
        if len(call.args) == 2 and not call.keywords and m.in_kernel(call) and isinstance(m.parent.get(call),
                                                                                          (ast.Subscript, ast.Tuple)):
            start, size = (m.text(a) for a in call.args)
            if isinstance(call.args[0], ast.Constant):
                continue  # a static start is a legal Python slice
            wrapped = f"({start})" if isinstance(call.args[0], ast.BinOp) else start
            sites.append(m.site(call, f"{start}:{wrapped} + {size}", lo=start, size=size))
    return sites


def find_traced_value_slice(m: SourceModule) -> list[Site]:
    """`ref[pl.ds(start, size)]` written as a load of the whole block sliced in Python,
    `ref[...][start:start + size]`: a jax array cannot take a traced slice bound."""
    sites = []
    for node in m.nodes(ast.Subscript):
        if not (isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and m.in_kernel(node)):
            continue
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        calls = [p for p in parts if isinstance(p, ast.Call) and dotted_name(p.func) == "pl.ds" and len(p.args) == 2]
        if not calls or any(isinstance(c.args[0], ast.Constant) for c in calls):
            continue
        texts = []
        for p in parts:
            if p in calls:
                start, size = (m.text(a) for a in p.args)
                wrapped = f"({start})" if isinstance(p.args[0], ast.BinOp) else start
                texts.append(f"{start}:{wrapped} + {size}")
            else:
                texts.append(m.text(p))
        sites.append(m.site(node, f"{node.value.id}[...][{', '.join(texts)}]", ref=node.value.id,
                            lo=m.text(calls[0].args[0]), size=m.text(calls[0].args[1])))
    return sites


def find_missing_in_spec(m: SourceModule) -> list[Site]:
    """One operand left without a BlockSpec: the last entry of `in_specs` forgotten."""
    sites = []
    for call in m.calls("pl.pallas_call"):
        kw = _pallas_keyword(call, "in_specs")
        if kw is not None and isinstance(kw.value, ast.List) and len(kw.value.elts) >= 2:
            kept = kw.value.elts[:-1]
            text = "[" + ", ".join(m.text(e) for e in kept) + "]"
            if "\n" in m.text(kw.value):
                continue  # one spec per line: the edit would not read like a slip
            sites.append(m.site(kw.value, text, dropped=m.text(kw.value.elts[-1]), count=str(len(kw.value.elts))))
    return sites


_CONSTANT_WORDS = ("scale", "eps", "inv", "alpha", "beta")


def find_captured_constant(m: SourceModule) -> list[Site]:
    """A float parameter bound into the kernel as a jax array (`scale=jnp.float32(...)`): the
    kernel then closes over an array constant, which pallas_call refuses."""
    sites = []
    for call in m.calls("functools.partial"):
        if not call.args or not isinstance(call.args[0], ast.Name) or call.args[0].id not in m.kernel_names:
            continue
        for kw in call.keywords:
            text = m.text(kw.value)
            if kw.arg and (any(w in kw.arg for w in _CONSTANT_WORDS) or "**" in text or "." in text.split("(")[0]):
                sites.append(m.site(kw.value, f"jnp.float32({text})", param=kw.arg, value=text))
    return sites


_REDUCTIONS = ("jnp.sum", "jnp.max", "jnp.min", "jnp.mean")


def find_dropped_keepdims(m: SourceModule) -> list[Site]:
    """A row reduction without `keepdims=True`, then broadcast against the block it reduced."""
    sites = []
    for call in m.nodes(ast.Call):
        if dotted_name(call.func) in _REDUCTIONS and m.in_kernel(call):
            kws = {k.arg: k for k in call.keywords}
            if "keepdims" in kws and m.text(kws["keepdims"].value) == "True" and "axis" in kws:
                args = [m.text(a) for a in call.args] + [m.text(k) for k in call.keywords if k.arg != "keepdims"]
                sites.append(m.site(call, f"{dotted_name(call.func)}({', '.join(args)})", reduction=dotted_name(call.func), axis=m.text(kws["axis"].value)))
    return sites


def find_transposed_operand(m: SourceModule) -> list[Site]:
    """The right operand of a matmul transposed by mistake (`jnp.dot(a, b.T)`)."""
    sites = []
    for call in m.calls("jnp.dot"):
        if len(call.args) == 2 and m.in_kernel(call) and not m.text(call.args[1]).endswith(".T"):
            right = call.args[1]
            text = m.text(right) if isinstance(right, (ast.Name, ast.Subscript, ast.Call, ast.Attribute)) \
                else f"({m.text(right)})"
            sites.append(m.site(right, f"{text}.T", operand=m.text(right)))
    return sites


def find_triton_primitive(m: SourceModule) -> list[Site]:
    """A GPU Pallas primitive in a TPU kernel: `pl.broadcast_to` for `jnp.broadcast_to`, or to
    fill a tile where `jnp.full(shape, value, dtype)` belongs."""
    sites = [m.site(c.func, "pl.broadcast_to", old="jnp.broadcast_to", new="pl.broadcast_to")
             for c in m.calls("jnp.broadcast_to") if m.in_kernel(c)]
    for c in m.calls("jnp.full"):
        if m.in_kernel(c) and len(c.args) == 3 and not c.keywords and dotted_name(c.args[2]).startswith("jnp."):
            shape, value, dtype = (m.text(a) for a in c.args)
            sites.append(m.site(c, f"pl.broadcast_to({dtype}({value}), {shape})", old="jnp.full", new="pl.broadcast_to"))
    return sites


def find_missing_import(m: SourceModule) -> list[Site]:
    """An import the module uses, left out."""
    sites = []
    for node in m.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and len(node.names) == 1:
            alias = node.names[0]
            bound = alias.asname or alias.name.split(".")[0]
            if bound in STANDARD_IMPORTS and m.text(node) == STANDARD_IMPORTS[bound]:
                sites.append(Site([m.delete_lines(node.lineno, node.end_lineno)], node.lineno,
                                  dict(function="<module>", line=str(node.lineno), name=bound, statement=m.text(node)),
                                  tidy=False))
    return sites


_ENTRY_NAMES = ("pallas_{task}", "{task}_kernel", "solution", "forward")


def find_wrong_entry_point(m: SourceModule) -> list[Site]:
    """The entry point named after the task (`def softmax_kernel(...)`) rather than `kernel`."""
    entry = next((f for f in m.tree.body if isinstance(f, ast.FunctionDef) and f.name == "kernel"), None)
    if entry is None:
        return []
    taken = {f.name for f in m.nodes(ast.FunctionDef)}
    options = [n.format(task=m.task.name) for n in _ENTRY_NAMES if n.format(task=m.task.name) not in taken]
    if not options:
        return []
    new = _stable_pick(options, m.task.name)
    start = (entry.lineno, entry.col_offset + len("def "))
    return [Site([Edit(start, (entry.lineno, start[1] + len("kernel")), new)], entry.lineno,
                 dict(function=new, line=str(entry.lineno), name=new), tidy=False)]


_PROSE = ("Here is the optimized Pallas TPU kernel:", "Below is the complete implementation.",
          "**Note:** block sizes are multiples of (8, 128).", "The kernel tiles the rows and keeps each block in VMEM.")


def find_prose_in_code(m: SourceModule) -> list[Site]:
    """A line of prose inside the code block: the answer's text leaked into the module."""
    first = next((n for n in m.tree.body if isinstance(n, ast.FunctionDef)), None)
    if first is None:
        return []
    line = min([d.lineno for d in first.decorator_list] + [first.lineno])
    text = _stable_pick(list(_PROSE), m.task.name)
    return [Site([Edit((line, 0), (line, 0), f"{text}\n\n")], line, dict(function="<module>", line=str(line),
                                                                        text=text), tidy=False)]


# --- the operators -------------------------------------------------------------------------------

INJECTORS: tuple[BugOperator, ...] = (
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
    BugOperator("dma_never_waited", "a DMA started but never waited", find_dma_never_waited),
    BugOperator("double_buffer_race", "prefetch into the buffer slot being read (race)",
                find_double_buffer_race),
    BugOperator("no_parallel_axis", "every grid axis marked arbitrary (no megacore parallelism)",
                find_no_parallel_axis, "static"),
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
                "surface", parses=False),
    BugOperator("interpret_flag", "`interpret=True` left in pallas_call", find_interpret_flag, "surface"),
    BugOperator("hallucinated_import", "importing a Pallas module that does not exist", find_hallucinated_import,
                "surface"),
    BugOperator("program_id_axis", "pl.program_id on the wrong grid axis", find_program_id_axis),
    BugOperator("overwrite_accumulator", "accumulator assigned instead of accumulated",
                find_overwrite_accumulator),
    BugOperator("plain_jax", "no Pallas at all: the reference in jax.numpy", find_plain_jax, "surface"),
    BugOperator("copy_kernel_shortcut", "the work done in jax.numpy, then passed through a copy kernel",
                find_copy_kernel_shortcut, "surface"),
    BugOperator("literal_block_size", "a block size written as a round literal (100, 250, 500), not a multiple "
                "of (8, 128)", find_literal_block_size, "static"),
    BugOperator("oversized_block", "a block size written as a large literal that overflows VMEM at the bench "
                "sizes", find_oversized_block, "static"),
    BugOperator("traced_slice", "a Python slice with traced bounds where `pl.ds` belongs", find_traced_slice,
                "static"),
    BugOperator("traced_value_slice", "a block loaded whole, then sliced in Python with traced bounds",
                find_traced_value_slice, "static"),
    BugOperator("missing_in_spec", "one operand left without a BlockSpec in `in_specs`", find_missing_in_spec,
                "static"),
    BugOperator("captured_constant", "a float parameter bound into the kernel as a jax array",
                find_captured_constant, "static"),
    BugOperator("dropped_keepdims", "a row reduction without keepdims=True, broadcast against its block",
                find_dropped_keepdims, "static"),
    BugOperator("transposed_operand", "the right operand of a matmul transposed by mistake",
                find_transposed_operand, "static"),
    BugOperator("triton_primitive", "a GPU Pallas primitive (pl.broadcast_to) in a TPU kernel",
                find_triton_primitive, "static"),
    BugOperator("missing_import", "an import the module uses left out", find_missing_import, "surface"),
    BugOperator("wrong_entry_point", "the entry point under another name than `kernel`", find_wrong_entry_point,
                "surface"),
    BugOperator("prose_in_code", "a line of prose inside the code block", find_prose_in_code, "surface",
                parses=False),
)


def _in_catalogue_order() -> tuple[BugOperator, ...]:
    by_name = {op.name: op for op in INJECTORS}
    listed = [name for k in KINDS for name in k.operators]
    missing = sorted(set(by_name) - set(listed))
    if missing or len(listed) != len(set(listed)):
        raise ImportError(f"every bug operator belongs to exactly one failure kind; not listed: {missing}")
    return tuple(by_name[name] for name in listed)


# Every injector, in catalogue order: the mutation source's operators.
OPERATORS: tuple[BugOperator, ...] = _in_catalogue_order()
OPERATOR_NAMES = tuple(op.name for op in OPERATORS)


def operator(name: str) -> BugOperator:
    for op in OPERATORS:
        if op.name == name:
            return op
    raise KeyError(f"unknown bug operator {name!r}; known: {', '.join(OPERATOR_NAMES)}")
