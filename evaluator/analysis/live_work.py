"""Which equations of a kernel body do work that reaches its outputs, and how much.

Provenance (evaluator/analysis/provenance.py) asks whose code does a kernel's work. Counting equations
answers a different question: forty dead scalar equations of our own around one call to a
library's kernel body outnumber the library's few dozen. So the body is first cut down to what
reaches its outputs (dead-code elimination), then each equation left is weighed by its cost
(evaluator/analysis/jaxpr_cost.py: dot FLOPs, transcendentals, one per vector element); scalar
bookkeeping (index arithmetic, loop counters) weighs nothing.

Liveness runs backwards over the flattened body (kernel_dataflow: refs and values bound into
nested jaxprs are one variable wherever used). The output refs are live. A store (`swap`) or
DMA into a live ref is live, and makes what it stores (or the DMA's source ref) live; a read
(`get`) whose value is live makes its ref live, so a scratch buffer that feeds an output is
followed back to whatever filled it. Any other equation is live when one of its results is.
It runs to a fixed point (a value carried round a loop). Control predicates (a cond's index,
a while loop's test) are not followed: they are scalars, which weigh nothing anyway.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator

from evaluator.analysis.jaxpr_cost import trip_count, walk
from evaluator.analysis.jaxpr_walk import sub_jaxprs
from evaluator.analysis.kernel_dataflow import READS, WRITES, Aliases, bind_sub_jaxprs, dma_ends, is_ref, is_var


@dataclass
class EquationWork:
    """One live equation of a kernel body and what it costs per grid step (loop trips included)."""

    eqn: Any
    work: float  # FLOPs (matmul FLOPs, one per vector element) plus transcendentals
    bytes: float  # bytes it touches, or copies by DMA


def live_work(kernel_jaxpr: Any, outputs: list[Any]) -> list[EquationWork]:
    """The equations of `kernel_jaxpr` (nested ones included) whose results reach one of the
    output refs `outputs`, each with its cost; dead equations are left out."""
    aliases = Aliases()
    leaves = [(eqn, mult) for eqn, mult in _flatten(kernel_jaxpr, aliases, 1.0)
              if not list(sub_jaxprs(eqn))]  # containers are transparent: their insides count
    live = _live_equations([eqn for eqn, _ in leaves], aliases, outputs)
    return [EquationWork(eqn, *_weigh(eqn, mult)) for i, (eqn, mult) in enumerate(leaves) if i in live]


def _flatten(jaxpr: Any, aliases: Aliases, mult: float) -> Iterator[tuple[Any, float]]:
    """Every equation with the times it runs per grid step (scans their length; while loops
    once, their bound is not known here), bindings of nested jaxprs joined."""
    for eqn in jaxpr.eqns:
        yield eqn, mult
        count, _ = trip_count(eqn)
        for sub in bind_sub_jaxprs(eqn, aliases):
            yield from _flatten(sub, aliases, mult * count)


def _live_equations(eqns: list[Any], aliases: Aliases, outputs: list[Any]) -> set[int]:
    live_refs = {aliases.find(o) for o in outputs}
    live_values: set[int] = set()
    live: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(eqns))):  # backwards: straight-line code settles in one pass
            eqn = eqns[i]
            if i in live:
                continue
            needs = _needs(eqn, aliases, live_refs, live_values)
            if needs is None:
                continue
            live.add(i)
            changed = True
            refs, values = needs
            live_refs |= refs
            live_values |= values
    return live


def _needs(eqn: Any, aliases: Aliases, live_refs: set[int], live_values: set[int]
           ) -> tuple[set[int], set[int]] | None:
    """None if `eqn` is dead given what is live so far; else the refs and values it needs."""
    name = eqn.primitive.name
    refs = [aliases.find(v) for v in eqn.invars if is_ref(v)]
    values = {aliases.find(v) for v in eqn.invars if is_var(v) and not is_ref(v)}
    result_live = any(is_var(v) and aliases.find(v) in live_values for v in eqn.outvars)
    if name in WRITES and refs:
        if refs[0] in live_refs or result_live:  # swap returns the old contents
            return ({refs[0]} if result_live or name in READS else set()), values
        return None
    if name in READS and refs:
        return ({refs[0]}, values) if result_live else None
    if name == "dma_start":
        ends = dma_ends(eqn, aliases)
        if ends is not None:
            src, dst = ends
            return ({src, *refs}, values) if dst in live_refs else None
    if refs and not eqn.outvars:  # waits, semaphores, a DMA whose ends are not known
        return (set(refs), values) if any(r in live_refs for r in refs) else None
    if result_live or any(r in live_refs for r in refs):
        return set(refs), values
    return None


def _weigh(eqn: Any, mult: float) -> tuple[float, float]:
    """(work, bytes) of one leaf equation run `mult` times. Scalar results (index
    arithmetic, counters, a scalar read from SMEM) weigh no work."""
    cost = walk(SimpleNamespace(eqns=[eqn]))
    scalar = all(not getattr(getattr(v, "aval", None), "shape", ()) for v in eqn.outvars)
    work = 0.0 if scalar and not cost.matmul_flops else cost.flops + cost.transcendentals
    return mult * work, mult * (cost.bytes_accessed + cost.dma_bytes)
