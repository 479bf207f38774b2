"""The HBM bytes the glue around kernels moves once XLA has fused it: what crosses its border.

Walked op by op (evaluator/analysis/jaxpr_cost.py), glue counts every op's inputs and outputs, as
if each went through HBM; XLA fuses chains of elementwise work, broadcasts and reductions, so a
candidate that leaves a softmax's exp, sum and divide to XLA moves its tensor about twice, not
six times. Here the glue is read where it takes a value from the program's inputs or a kernel,
and written where it hands one to a kernel or the program's outputs: the bytes of perfect fusion.
Reshapes and other ops XLA makes free pass values through. The speed prediction prices glue at
the lesser of the two counts (evaluator/performance/prediction.py).
"""
from __future__ import annotations

from typing import Any

from evaluator.analysis.jaxpr_cost import aval_nbytes, is_free
from evaluator.analysis.jaxpr_walk import sub_jaxprs

# Calls whose body runs inline: their kernels and glue are the caller's.
INLINE_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                          "custom_vjp_call_jaxpr", "remat", "checkpoint"})


def fused_glue_bytes(jaxpr: Any) -> float:
    """Bytes the glue of an open jaxpr reads from inputs and kernels and writes to kernels and
    outputs, each value once."""
    walk = _Border()
    walk.visit(jaxpr, {v: v for v in (*jaxpr.constvars, *jaxpr.invars)})
    for v in (*jaxpr.constvars, *jaxpr.invars):
        walk.made_by[v] = "input"
    outputs = {walk.key(v, {}) for v in jaxpr.outvars}
    read = sum(walk.size[v] for v in walk.glue_reads if walk.made_by.get(v) in ("input", "kernel"))
    written = sum(walk.size[v] for v, kind in walk.made_by.items()
                  if kind == "glue" and (v in walk.kernel_reads or v in outputs))
    return float(read + written)


class _Border:
    def __init__(self) -> None:
        self.made_by: dict[Any, str] = {}
        self.size: dict[Any, int] = {}
        self.alias: dict[Any, Any] = {}
        self.glue_reads: set[Any] = set()
        self.kernel_reads: set[Any] = set()

    def key(self, var: Any, env: dict[Any, Any]) -> Any:
        if hasattr(var, "val"):  # a literal: nothing is read from memory
            return None
        v = env.get(var, var)
        while v in self.alias:
            v = self.alias[v]
        self.size.setdefault(v, aval_nbytes(var.aval))
        return v

    def visit(self, jaxpr: Any, env: dict[Any, Any]) -> None:
        for eqn in jaxpr.eqns:
            ins = [k for k in (self.key(v, env) for v in eqn.invars) if k is not None]
            name = eqn.primitive.name
            inner = list(sub_jaxprs(eqn))
            if not inner and is_free(eqn) and len(ins) == 1 and len(eqn.outvars) == 1:
                self.alias[eqn.outvars[0]] = ins[0]
                continue
            has_kernel = name == "pallas_call" or _contains_kernel(eqn)
            if name in INLINE_CALLS and has_kernel and len(inner) == 1:
                body = inner[0]
                self.visit(body, {**dict(zip(body.invars, [self.key(v, env) for v in eqn.invars])),
                                  **{c: c for c in body.constvars}})
                for c in body.constvars:
                    self.made_by.setdefault(c, "input")
                for outer, inner_out in zip(eqn.outvars, body.outvars):
                    target = self.key(inner_out, {})
                    if target is not None:
                        self.alias[outer] = target
                continue
            kind = "kernel" if has_kernel else "glue"
            (self.kernel_reads if has_kernel else self.glue_reads).update(ins)
            for out in eqn.outvars:
                self.made_by[out] = kind
                self.size[out] = aval_nbytes(out.aval)


def _contains_kernel(eqn: Any) -> bool:
    return any(e.primitive.name == "pallas_call" or _contains_kernel(e) for j in sub_jaxprs(eqn) for e in j.eqns)
