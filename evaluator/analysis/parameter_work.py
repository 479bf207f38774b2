"""Work on a task's parameters alone, outside the kernels: weight preprocessing.

A KernelBench model's weights are set once and used for every input; an answer may fold them
before its kernel runs (`sum(x @ W + b, axis=1)` as `x @ W.sum(0) + b.sum()`, an exact rewrite
that does less work at every size). Such folding reads no activation, so it cannot compute
any part of the answer on its own: it is not "the task's work done in XLA". The outside-work
rules therefore weigh only the equations that depend on an activation (kernel()'s arguments
before the task's first parameter); the folded work is reported, not refused.

An equation counts as parameter-only when every input is a parameter, a constant, or derived
from those alone, outside any pallas_call; a pallas_call's outputs always count as work (its
outputs are the kernel's), and host callbacks are never folded away.
"""
from __future__ import annotations

from typing import Any

from jax.extend import core as jcore

from evaluator.analysis.jaxpr_cost import CALLBACK_PRIMITIVES
from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, sub_jaxprs

# Calls whose body is a function of their operands: walked with the operands' parameter-ness.
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
                    "custom_vjp_call"})


def without_parameter_work(jaxpr: Any, first_parameter: int | None) -> tuple[Any, int]:
    """The jaxpr without its parameter-only equations (also inside calls), and how many were
    dropped. `first_parameter`: the index of kernel()'s first parameter argument, None when
    the task declares none (then nothing changes)."""
    if first_parameter is None or first_parameter >= len(jaxpr.invars):
        return jaxpr, 0
    activations = set(jaxpr.invars[:first_parameter])
    return _prune(jaxpr, activations)


def _prune(jaxpr: Any, activations: set) -> tuple[Any, int]:
    """Drop the equations none of whose inputs is in `activations` (which grows with every
    equation that reads one)."""
    kept, dropped = [], 0
    for eqn in jaxpr.eqns:
        reads = any(isinstance(v, jcore.Var) and v in activations for v in eqn.invars)
        name = eqn.primitive.name
        if name in _CALLS and reads:
            eqn, n = _prune_call(eqn, activations)
            dropped += n
        elif not reads and not _runs_a_kernel_or_callback(eqn):
            dropped += 1
            continue
        activations.update(eqn.outvars)
        kept.append(eqn)
    return (jaxpr.replace(eqns=kept) if dropped else jaxpr), dropped


def _prune_call(eqn: Any, activations: set) -> tuple[Any, int]:
    """A call that reads an activation: its body pruned with the operands' parameter-ness."""
    key = next((k for k, v in eqn.params.items() if is_closed_jaxpr(v)), None)
    if key is None:
        return eqn, 0
    closed = eqn.params[key]
    inner = {b for a, b in zip(eqn.invars, closed.jaxpr.invars) if isinstance(a, jcore.Var) and a in activations}
    body, dropped = _prune(closed.jaxpr, inner)
    if not dropped:
        return eqn, 0
    return eqn.replace(params={**eqn.params, key: closed.replace(jaxpr=body)}), dropped


def _runs_a_kernel_or_callback(eqn: Any) -> bool:
    """A pallas_call or a host callback, itself or anywhere inside the equation."""
    if eqn.primitive.name == "pallas_call" or eqn.primitive.name in CALLBACK_PRIMITIVES:
        return True
    return any(_runs_a_kernel_or_callback(e) for j in sub_jaxprs(eqn) for e in j.eqns)
