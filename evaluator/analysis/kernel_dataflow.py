"""What a kernel body does with its refs: which are written and read, and where values read
from them flow. The evidence behind the `vmem_scratch` and `scalar_prefetch` requirements
(evaluator/analysis/features.py): declared is not used.

A kernel body is a jaxpr whose inputs are refs (prefetched scalars, inputs, outputs, scratch).
Refs and values travel into nested jaxprs (pl.when's cond, fori_loop's while or scan,
run_scoped, calls) by position; each such binding joins the inner variable with the outer one,
so a ref is one thing wherever it is used. Values read from a ref are followed through every
equation (taint), and a ref that receives such a value, by a store or by a DMA, becomes a
source in turn; this runs to a fixed point, so a value stored in one loop iteration and read in
the next is followed too. A DMA moves its source's contents into its destination, not back. It
over-approximates (an equation that takes a followed value passes it to all its results), which
is the safe side for a check that refuses kernels, with two exceptions that hold whatever the
values: a select whose predicate is a constant passes only the case it chooses, and a product
with a constant zero passes nothing. A feature used only where such an equation drops it feeds
no output (evaluator/analysis/features.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, sub_jaxprs

# Primitives that read a ref's contents into a value, and that write a value into a ref
# (their first operand is the ref).
READS = frozenset({"get", "load", "masked_load", "addupdate"})
WRITES = frozenset({"swap", "masked_swap", "store", "addupdate"})


@dataclass
class RefUse:
    """One ref of a kernel body: is it written, is it read, and does a value read from it
    reach an output (stored there, or copied there by DMA), or any computation at all."""

    written: bool = False
    read: bool = False
    reaches_output: bool = False
    feeds_computation: bool = False


class Aliases:
    """Union-find over jaxpr variables: an inner binding and its outer operand are one. A
    variable bound to a literal (`jnp.where(False, ...)` passes False into its jaxpr) keeps the
    literal's value in `constants`, by its root."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.constants: dict[int, Any] = {}

    def find(self, v: Any) -> int:
        key = id(v)
        root = self.parent.setdefault(key, key)
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[key] = root
        return root

    def join(self, a: Any, b: Any) -> None:
        if is_var(a) and is_var(b):
            self.parent[self.find(a)] = self.find(b)
        elif is_var(a) != is_var(b):  # one side a literal
            var, literal = (a, b) if is_var(a) else (b, a)
            if hasattr(literal, "val"):
                self.constants[self.find(var)] = literal.val

    def constant(self, v: Any) -> Any:
        """The value of a literal, or of a variable known to hold one; None otherwise."""
        if hasattr(v, "val") and not is_var(v):
            return v.val
        return self.constants.get(self.find(v)) if is_var(v) else None


def is_var(v: Any) -> bool:
    return hasattr(v, "aval") and not hasattr(v, "val")  # Literals carry .val


def is_ref(v: Any) -> bool:
    return is_var(v) and hasattr(v.aval, "inner_aval")


def _flatten(jaxpr: Any, aliases: Aliases) -> Iterator[Any]:
    """Every equation of the body, nested ones included, with their bindings joined."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in bind_sub_jaxprs(eqn, aliases):
            yield from _flatten(sub, aliases)


def bind_sub_jaxprs(eqn: Any, aliases: Aliases) -> list[Any]:
    """The jaxprs nested in `eqn`, their inputs and outputs joined with the operands and
    results they bind (also used by evaluator/analysis/live_work.py)."""
    name, params = eqn.primitive.name, eqn.params
    subs = list(sub_jaxprs(eqn))
    if name == "cond":
        for branch in subs:
            _join_all(aliases, eqn.invars[1:], branch.invars)
            _join_all(aliases, branch.outvars, eqn.outvars)
    elif name == "while":
        cond = _open(params["cond_jaxpr"])
        body = _open(params["body_jaxpr"])
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        carry = eqn.invars[nc + nb:]
        _join_all(aliases, eqn.invars[:nc], cond.invars[:nc])
        _join_all(aliases, carry, cond.invars[nc:])
        _join_all(aliases, eqn.invars[nc:nc + nb], body.invars[:nb])
        _join_all(aliases, carry, body.invars[nb:])
        _join_all(aliases, body.outvars, carry)
        _join_all(aliases, carry, eqn.outvars)
    elif name == "scan":
        body = subs[0]
        nconsts, ncarry = params["num_consts"], params["num_carry"]
        _join_all(aliases, eqn.invars, body.invars)
        _join_all(aliases, body.outvars[:ncarry], eqn.invars[nconsts:nconsts + ncarry])
        _join_all(aliases, body.outvars, eqn.outvars)
    else:  # calls (pjit, closed_call, custom_jvp...), run_scoped: operands bind from the end
        for sub in subs:
            _join_all(aliases, eqn.invars[::-1], sub.invars[::-1])
            _join_all(aliases, sub.outvars[::-1], eqn.outvars[::-1])
    return subs


def _open(item: Any) -> Any:
    return item.jaxpr if is_closed_jaxpr(item) else item


def _join_all(aliases: Aliases, inner: Any, outer: Any) -> None:
    for a, b in zip(inner, outer):
        aliases.join(a, b)


def ref_uses(kernel_jaxpr: Any, sources: list[Any], outputs: list[Any]) -> list[RefUse]:
    """For each ref in `sources` (kernel body invars): its use, followed as described above.
    `outputs` are the body's output refs."""
    aliases = Aliases()
    eqns = list(_flatten(kernel_jaxpr, aliases))
    _fold_constants(eqns, aliases)
    out_ids = {aliases.find(o) for o in outputs}
    return [_follow(eqns, aliases, aliases.find(src), out_ids) for src in sources]


def dma_uses(kernel_jaxpr: Any, outputs: list[Any]) -> list[RefUse]:
    """The use of each distinct ref a DMA of the body copies into: what the kernel does with
    what its DMAs bring. A destination that is an output ref reaches the output by itself."""
    aliases = Aliases()
    eqns = list(_flatten(kernel_jaxpr, aliases))
    _fold_constants(eqns, aliases)
    out_ids = {aliases.find(o) for o in outputs}
    destinations = list(dict.fromkeys(ends[1] for e in eqns if e.primitive.name == "dma_start"
                                      and (ends := dma_ends(e, aliases)) is not None))
    uses = []
    for dst in destinations:
        use = _follow(eqns, aliases, dst, out_ids)
        if dst in out_ids:
            use.read = use.reaches_output = True
        uses.append(use)
    return uses


def dma_ends(eqn: Any, aliases: Aliases) -> tuple[int, int] | None:
    """(source ref, destination ref) of a dma_start, from its operand tree; None where this
    jax lays its operands out otherwise."""
    try:
        src, dst = eqn.params["tree"].unflatten(list(eqn.invars))[:2]
    except Exception:  # noqa: BLE001  (another jax's layout of the operands)
        return None
    src, dst = getattr(src, "ref", src), getattr(dst, "ref", dst)
    if not (is_ref(src) and is_ref(dst)):
        return None
    return aliases.find(src), aliases.find(dst)


# Equations whose result is their operand's value, reshaped or cast: a constant stays one.
_PASS_THROUGH = frozenset({"broadcast_in_dim", "convert_element_type", "reshape", "squeeze", "expand_dims"})


def _fold_constants(eqns: list[Any], aliases: Aliases) -> None:
    """Record, in body order, the variables that hold a literal's value reshaped or cast (the
    predicate `jnp.where(False, ...)` broadcasts, a zero a value is multiplied by)."""
    for eqn in eqns:
        if eqn.primitive.name in _PASS_THROUGH and eqn.invars and eqn.outvars:
            value = aliases.constant(eqn.invars[0])
            if value is not None and is_var(eqn.outvars[0]):
                aliases.constants[aliases.find(eqn.outvars[0])] = value


def _flowing(eqn: Any, aliases: Aliases) -> list[Any]:
    """The operands whose values reach an arithmetic equation's results: all of them, but the
    cases a constant predicate does not choose (select_n) and anything multiplied by a constant
    zero, whose product is zero whatever it was."""
    name, ins = eqn.primitive.name, list(eqn.invars)
    if name == "select_n" and ins:
        which = _scalar(aliases.constant(ins[0]))
        if which is not None and 0 <= int(which) < len(ins) - 1:
            return [ins[1 + int(which)]]
    if name == "mul" and any(_scalar(aliases.constant(v)) == 0 for v in ins):
        return []
    return ins


def _scalar(value: Any) -> Any:
    """A constant's one value (a literal, or an array holding it everywhere), else None."""
    if value is None:
        return None
    flat = np.asarray(value).ravel()
    return flat[0].item() if flat.size and (flat == flat[0]).all() else None


# Equations whose nested jaxprs `_flatten` walks with their operands and results bound
# (bind_sub_jaxprs): what flows through them is what flows through their equations, so they pass
# nothing of their own. A cond's branch index decides which branch runs: its value reaches
# everything the cond computes or writes (`_follow`).
_TRANSPARENT = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                          "checkpoint", "remat", "while", "scan", "cond"})


def _follow(eqns: list[Any], aliases: Aliases, source: int, outputs: set[int]) -> RefUse:
    use = RefUse()
    for eqn in eqns:
        refs = [aliases.find(v) for v in eqn.invars if is_ref(v)]
        name = eqn.primitive.name
        if refs and refs[0] == source:
            use.written |= name in WRITES
            use.read |= name in READS
        if name == "dma_start" and (ends := dma_ends(eqn, aliases)) is not None:
            use.read |= ends[0] == source   # copied out of
            use.written |= ends[1] == source  # copied into
        elif source in refs and name not in READS | WRITES | _TRANSPARENT:  # a DMA of unknown layout
            use.written = use.read = True
    carriers = {source}  # refs holding data that came from the source
    tainted: set[int] = set()  # values computed from such data
    changed = True
    while changed:
        changed = False
        for eqn in eqns:
            name = eqn.primitive.name
            refs = [aliases.find(v) for v in eqn.invars if is_ref(v)]
            flowing = eqn.invars[:1] if name == "cond" else [] if name in _TRANSPARENT else _flowing(eqn, aliases)
            from_value = any(aliases.find(v) in tainted for v in flowing if is_var(v) and not is_ref(v))
            use.feeds_computation |= from_value
            ends = dma_ends(eqn, aliases) if name == "dma_start" else None
            if name in _TRANSPARENT:  # its own equations carry it; a cond's index, everything it does
                receives = returns = from_value
                targets = refs
            elif name in WRITES:  # a store: its first ref receives the value; swap returns the old one
                receives, returns = from_value, bool(refs) and refs[0] in carriers
                targets = refs[:1]
            elif name in READS:
                receives, returns = False, from_value or (bool(refs) and refs[0] in carriers)
                targets = []
            elif ends is not None:  # a DMA moves its source's contents into its destination
                receives, returns, targets = ends[0] in carriers, False, [ends[1]]
            else:  # arithmetic, or a DMA / call that moves between all its refs
                moved = from_value or any(r in carriers for r in refs)
                receives, returns, targets = moved, moved, refs
            if receives:
                use.reaches_output |= any(t in outputs for t in targets)
                for t in targets:
                    if t not in carriers:
                        carriers.add(t)
                        changed = True
            if returns:
                for out in eqn.outvars:
                    if is_var(out) and aliases.find(out) not in tainted:
                        tainted.add(aliases.find(out))
                        changed = True
    return use
