"""How a search repair is told in a pair's explanation, the way a reviewer would put it: what was
wrong, why it fails on TPU, what the edit does.

A describer reads the edit (the kernel before and after) and the verdict message it answered,
and checks its claims against them: the two sources must differ exactly where the prose says
(`_changed`), and the numbers it quotes come from the message. An edit it does not recognise
gets '', and repair_search.explain falls back to listing the changed lines.

    DESCRIPTIONS[repairer](before, after, message) -> prose | ''
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable

from data_gen.failures.edits import dotted_name
from data_gen.repairs.repairers import (OVER_LIMIT, ROWS_PER_BLOCK, VMEM_HEADROOM, RepairModule, parse_source,
                                        refused_block, repair, row_block_refused)
from evaluator.candidate.policy import parse_module

Describer = Callable[[str, str, str], str]


def _changed(before: RepairModule, after: RepairModule, nodes: list[ast.AST]) -> list[tuple[ast.AST, str, int]] | None:
    """Of `nodes` (of `after`), those that stand in place of other text in `before`, each with
    that text and its line, when the two sources differ only at `nodes` (each within one line);
    None when they differ anywhere else or nowhere."""
    at = {(after.offset(n.lineno, n.col_offset), after.offset(n.end_lineno, n.end_col_offset)): n for n in nodes}
    spans = sorted(at)
    if not spans or any(start < end for (_, end), (start, _) in zip(spans, spans[1:])):
        return None
    pattern, pos = [], 0
    for start, end in spans:
        pattern += [re.escape(after.source[pos:start]), r"([^\n]*?)"]
        pos = end
    pattern.append(re.escape(after.source[pos:]))
    found = re.fullmatch("".join(pattern), before.source)
    if found is None:
        return None
    changed = [(at[span], found.group(i), before.source.count("\n", 0, found.start(i)) + 1)
               for i, span in enumerate(spans, 1) if found.group(i) != after.source[span[0]:span[1]]]
    return changed or None


def _is(text: str, expected: str) -> bool:
    """`text` is the expression `expected`, whatever its spacing and redundant parentheses."""
    try:
        got, want = parse_module(text.strip()).body, parse_module(expected).body
    except SyntaxError:
        return False
    return len(got) == len(want) == 1 and ast.dump(got[0]) == ast.dump(want[0])


def _lines(lines: list[int]) -> str:
    unique = sorted(set(lines))
    return f"line {unique[0]}" if len(unique) == 1 else "lines " + ", ".join(map(str, unique))


def _modules(before: str, after: str) -> tuple[RepairModule, RepairModule] | None:
    old, new = parse_source(before), parse_source(after)
    return None if old is None or new is None else (old, new)


# How each stand-in does the work, for a pair's explanation.
_STAND_IN_WORK = {
    "convolution": ("it pads and dilates the input and slices out each kernel tap's strided window outside the "
                    "kernel (data movement, no arithmetic), then runs every multiply-add in a blocked Pallas "
                    "matmul over (taps x input channels), one per feature group"),
    "matmul": "it runs the product in a blocked Pallas matmul, one grid axis per batch element",
}


def _replaced_calls(before: str, after: str, names: dict[str, str], in_kernel: bool) -> list[tuple[int, str]]:
    """(line, name) of each call to one of `names` inside (or outside) the kernels of `before`
    whose line no longer calls one in `after`: the calls a stand-in took over."""
    modules = _modules(before, after)
    if modules is None:
        return []
    old, new = modules
    kept = {c.lineno for c in new.calls(*names)}
    return [(c.lineno, dotted_name(c.func)) for c in old.calls(*names)
            if (old.kernel_of_node(c) is not None) == in_kernel and c.lineno not in kept]


def describe_work_outside(before: str, after: str, message: str) -> str:
    """What repair_work_outside did, for a pair's explanation: which XLA convolutions or matmuls
    (by line) now call which stand-in, and why that is the fix."""
    from data_gen.repairs.pallas_ops import STAND_INS

    replaced = _replaced_calls(before, after, STAND_INS, in_kernel=False)
    if not replaced:
        return ""
    ops = sorted({"convolution" if "conv" in name else "matmul" for _, name in replaced})
    what = " and ".join(ops)
    calls = ", ".join(f"`{name}` (line {line})" for line, name in replaced)
    stand_ins = ", ".join(sorted({STAND_INS[n] for _, n in replaced}))
    how = "; for a ".join(f"{op}, {_STAND_IN_WORK[op]}" for op in ops)
    # Stand-in names stay out of code spans: an explanation's spans name only what the failing
    # kernel holds (data_gen/rows/text_rules.py).
    return (f"The {what} ran in XLA: {calls} {'is' if len(replaced) == 1 else 'are'} called outside the Pallas "
            f"kernel, which does only the rest of the work. A {what} is this task's heavy work, and the grader "
            f"counts work only where a kernel does it. Fix: call the same {what} written in Pallas ({stand_ins}, "
            f"same arguments, its code added at the end of the module). For a {how}; every product accumulates "
            "in float32 in a VMEM scratch buffer.")


def describe_floor_grid(before: str, after: str, message: str) -> str:
    """wrong_values' grid edit: every `n // b` grid size written `pl.cdiv(n, b)`, nothing else."""
    modules = _modules(before, after)
    if modules is None:
        return ""
    old, new = modules
    changed = _changed(old, new, [c for c in new.calls("pl.cdiv") if len(c.args) == 2 and not c.keywords])
    if changed is None:
        return ""
    if not all(_is(text, f"({new.text(c.args[0])}) // ({new.text(c.args[1])})") for c, text, _ in changed):
        return ""
    floors = list(dict.fromkeys(f"`{text}`" for _, text, _ in changed))
    fixed = ", ".join(dict.fromkeys(f"`{new.text(c)}`" for c, _, _ in changed))
    rounds = "rounds" if len(floors) == 1 else "round"
    where = _lines([line for _, _, line in changed])
    return (f"The grid counts whole blocks only: {', '.join(floors)} ({where}) {rounds} down, so where a size "
            "is not a multiple of its block the last, partial block never runs and its part of the output is "
            f"never written. Fix: {fixed} blocks, one more wherever a size leaves a remainder. Pallas on TPU runs "
            "that block over the array's edge: its reads past the end are padding and its writes past the end are "
            "dropped.")


def describe_vmem_limit(before: str, after: str, message: str) -> str:
    """vmem_exhaustion's limit edit: one `vmem_limit_bytes=N` added or raised and nothing else,
    where our VMEM check named the need and the limit it is over. Checked by making the edit
    again: with those figures the repairer raises the limit (it halves blocks only without them)."""
    found = OVER_LIMIT.search(message)
    if found is None or repair("vmem_exhaustion", before, message) != after:
        return ""
    set_here = set(re.findall(r"vmem_limit_bytes=(\d+)", after)) - set(re.findall(r"vmem_limit_bytes=(\d+)", before))
    if len(set_here) != 1:
        return ""
    limit = int(set_here.pop())
    need, mib = float(found.group(1)), limit / 2**20
    over = (f"the default scoped limit Mosaic gives a kernel on {found.group(2)}" if found.group(2)
            else "the limit the kernel asked for")
    buffers = (" (each block held twice, so the next block's copy arrives while this one computes)"
               if re.search(r" x2\b", message) else "")
    return (f"The kernel's blocks and scratch need at least {need:g} MiB of VMEM{buffers}, more than {over}, so "
            "the compiler refuses it. They fit in the chip's VMEM, so the fix asks for more instead of shrinking "
            f"the blocks: `vmem_limit_bytes={limit}` ({mib:g} MiB: the need and {VMEM_HEADROOM - 1:.0%} more for the "
            "compiler's own scratch, in whole MiB) in the call's compiler params.")


_TILING = ("on TPU the last two dims of a block must be multiples of 8 and 128 (a vreg is 8 sublanes by 128 "
           "lanes) or the array's own")


def describe_block_alignment(before: str, after: str, message: str) -> str:
    """block_alignment's edits: a block of one row made a block of eight, where Mosaic refused one;
    otherwise block-size literals rounded up to a multiple of 8 or 128, nothing else."""
    if row_block_refused(message):
        return _describe_row_blocks(before, after, message)
    modules = _modules(before, after)
    if modules is None:
        return ""
    old, new = modules
    changed = _changed(old, new, [n for n in new.nodes(ast.Constant) if type(n.value) is int])
    if changed is None or any(not text.isdigit() or int(text) >= c.value for c, text, _ in changed):
        return ""
    refused = refused_block(message)
    which = (f"the block ({', '.join(map(str, refused[0]))}) of a ({', '.join(map(str, refused[1]))}) array breaks "
             "that, so Mosaic refuses to lower the kernel" if refused else "these sizes break that")
    sizes = "; ".join(f"{text} (line {line}) up to {c.value}, a multiple of {128 if c.value % 128 == 0 else 8}"
                      for c, text, line in changed)
    return f"A block size off TPU's tiling: {_TILING}, and {which}. Fix: round {sizes}."


def _describe_row_blocks(before: str, after: str, message: str) -> str:
    """The row-block edit (repairers._repair_row_blocks), checked by making it again."""
    refused = refused_block(message)
    if refused is None or repair("block_alignment", before, message) != after:
        return ""
    (_, cols), rows = refused[0][-2:], refused[1][-2]
    parts = [f"blocks of {ROWS_PER_BLOCK} rows, ({ROWS_PER_BLOCK}, {cols})"]
    more = lambda text: after.count(text) > before.count(text)  # noqa: E731
    if more("pl.cdiv("):
        parts.append(f"the grid walks the {rows} rows in `pl.cdiv` steps of {ROWS_PER_BLOCK}")
    if more("axis=-1") or more("keepdims=True"):
        parts.append(f"each reduction in the kernel runs along the last axis with its dim kept, so the "
                     f"{ROWS_PER_BLOCK} rows of a block are reduced apart")
    return (f"Blocks of one row, (1, {cols}), of a ({rows}, {cols}) array: {_TILING}, and one row out of {rows} "
            "is neither, so Mosaic refuses to lower the kernel. Fix: " + "; ".join(parts) + ".")


_TRACED_ARGUMENT = re.compile(r"depends on the value of the argument (\w+)")


def describe_traced_slice(before: str, after: str, message: str) -> str:
    """traced_index's edit: ref slices `lo:hi` with traced bounds written `pl.ds(lo, size)`."""
    modules = _modules(before, after)
    if modules is None:
        return ""
    old, new = modules
    changed = _changed(old, new, [c for c in new.calls("pl.ds") if len(c.args) == 2])
    if changed is None or any(":" not in text or not _is(text.split(":")[0], new.text(c.args[0]))
                              for c, text, _ in changed):
        return ""
    traced = _TRACED_ARGUMENT.search(message)
    cause = (f"depend on `{traced.group(1)}`, a traced value," if traced and any(traced.group(1) in text
                                                                                  for _, text, _ in changed)
             else "depend on a traced value")
    slices = ", ".join(dict.fromkeys(f"`{text}`" for _, text, _ in changed))
    windows = ", ".join(dict.fromkeys(f"`{new.text(c)}`" for c, _, _ in changed))
    return (f"The ref slices {slices} ({_lines([line for _, _, line in changed])}) have bounds that {cause} and "
            "a Python slice of a ref needs bounds known while the kernel is traced: jax checks them with Python "
            f"comparisons, which a traced value cannot answer. Fix: {windows}, a window with a traced start "
            "and a static size, which Pallas lowers to a dynamic slice of the ref.")


def describe_api_misuse(before: str, after: str, message: str) -> str:
    """api_misuse's edits of a call this JAX does not have as written: `pltpu.repeat` written as
    the jnp op that computes it, or `pl.when(c, f)` as the decorator it is, `pl.when(c)(f)`."""
    modules = _modules(before, after)
    if modules is None:
        return ""
    old, new = modules
    if "has no attribute 'repeat'" in message:
        changed = _changed(old, new, list(new.calls("jnp.tile", "jnp.concatenate")))
        if changed is None or not all(text.startswith("pltpu.repeat(") for _, text, _ in changed):
            return ""
        fixed = ", ".join(dict.fromkeys(f"`{new.text(c)}`" for c, _, _ in changed))
        return (f"`pltpu.repeat` ({_lines([line for _, _, line in changed])}) does not exist in the JAX the kernel "
                "runs on, so tracing the kernel stops there. What it was meant to compute is copies of a block "
                f"side by side. Fix: {fixed}, plain jnp ops that make the same copies and that Mosaic lowers inside "
                "the kernel.")
    if "when() takes 1 positional argument" in message:
        whens = [c for c in new.nodes(ast.Call) if isinstance(c.func, ast.Call)
                 and dotted_name(c.func.func) == "pl.when" and len(c.func.args) == len(c.args) == 1]
        changed = _changed(old, new, whens)
        if changed is None or not all(_is(text, f"pl.when({new.text(c.func.args[0])}, {new.text(c.args[0])})")
                                      for c, text, _ in changed):
            return ""
        calls = ", ".join(dict.fromkeys(f"`{text}`" for _, text, _ in changed))
        fixed = ", ".join(dict.fromkeys(f"`{new.text(c)}`" for c, _, _ in changed))
        return (f"{calls} ({_lines([line for _, _, line in changed])}) pass the function to `pl.when` as a second "
                "argument, but `pl.when` takes only the condition: it returns a decorator, and the function it "
                f"decorates runs when the condition holds. Fix: {fixed}, the condition first, then the function.")
    return ""


_ARRAY_RANK = re.compile(r"Block shape for (args|outputs)((?:\[\d+\])*) .*?must have the same number of "
                         r"dimensions as the array shape \(([^)]*)\)", re.S)


def describe_block_rank(before: str, after: str, message: str) -> str:
    """block_rank's edit where the index maps already walk every dim: block shapes one dim short
    given a squeezed (None) leading dim, nothing else."""
    found = _ARRAY_RANK.search(message)
    modules = _modules(before, after)
    if found is None or modules is None:
        return ""
    old, new = modules
    shapes = [c.args[0] for c in new.calls("pl.BlockSpec") if c.args and isinstance(c.args[0], ast.Tuple)
              and c.args[0].elts and isinstance(c.args[0].elts[0], ast.Constant) and c.args[0].elts[0].value is None]
    changed = _changed(old, new, shapes)
    if changed is None or not all(_is(text, "(" + ", ".join(new.text(e) for e in node.elts[1:]) + ",)")
                                  for node, text, _ in changed):
        return ""
    named = f"{found.group(1)}{found.group(2)}"
    olds = ", ".join(dict.fromkeys(f"`{text}`" for _, text, _ in changed))
    fixed = ", ".join(dict.fromkeys(f"`{new.text(node)}`" for node, _, _ in changed))
    return (f"Blocks one dim short of the arrays they tile: {olds} ({_lines([line for _, _, line in changed])}) "
            f"while their index maps return one index per array dim ({named} is an array of shape "
            f"({found.group(3)})). A block must have its array's rank; a dim the kernel should not see is written "
            f"`None`, squeezed: one element of it per block, at the index map's first result. Fix: {fixed}, "
            "the leading dim squeezed, so the kernel's refs keep the dims it reads.")


_UNLOWERED = re.compile(r"Unimplemented primitive in Pallas TPU lowering for \w+: (\w+)")


def describe_scan(before: str, after: str, message: str) -> str:
    """unsupported_op's scan edit: `jnp.cumsum` in a kernel (reversed with `jnp.flip` or not),
    which Mosaic cannot lower, calling the blocked scan of data_gen/repairs/kernel_ops.py."""
    from data_gen.repairs.kernel_ops import STAND_INS

    replaced = _replaced_calls(before, after, STAND_INS, in_kernel=True)
    unlowered = _UNLOWERED.search(message)
    reverse = after.count("reverse=True") > before.count("reverse=True")
    if not replaced or unlowered is None or unlowered.group(1) not in ("cumsum", "rev" if reverse else "cumsum"):
        return ""
    calls = ", ".join(f"`{name}` (line {line})" for line, name in replaced)
    if unlowered.group(1) == "rev":
        cause = (f"{calls} in the kernel, reversed by `jnp.flip` on both sides, cannot lower: Mosaic has no rule "
                 "for reversing an array inside a kernel (rev), nor for the cumulative sum between")
    else:
        cause = (f"{calls} in the kernel {'has' if len(replaced) == 1 else 'have'} no Mosaic lowering: the TPU "
                 "compiler has no rule for a cumulative sum inside a kernel")
    told = " (reverse=True for the sums from the end, which the flips asked for)" if reverse else ""
    order = "after it" if reverse else "before it"
    return (f"{cause}, so the kernel cannot compile however right the rest is. Fix: call the same scan written "
            f"with ops Mosaic lowers (_verified_cumsum, same arguments{told}, its code added at the end of the "
            "module). Along a row it cuts the row into 128-lane chunks; every chunk's running sums are one matmul "
            f"by a triangular matrix of ones, and each chunk adds the totals of the chunks {order} in a second "
            "matmul (down the rows of a block, one matmul from the left), all in float32 at the highest matmul "
            "precision.")


DESCRIPTIONS: dict[str, Describer] = {
    "work_outside": describe_work_outside,
    "wrong_values": describe_floor_grid,
    "vmem_exhaustion": describe_vmem_limit,
    "block_alignment": describe_block_alignment,
    "traced_bool": describe_traced_slice,
    "traced_index": describe_traced_slice,
    "api_misuse": describe_api_misuse,
    "unsupported_op": describe_scan,
    "block_rank": describe_block_rank,
}
