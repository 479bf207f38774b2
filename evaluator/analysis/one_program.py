"""One program at every size: what runs at a bench size must be what the check sizes ran.

Bench sizes are traced, lowered and (on a TPU) timed, never compared on a CPU; check sizes are
compared. A kernel that is right where it is checked and takes a shortcut where it is only timed
(other kernels, or kernels that no longer compute what they computed at check sizes) must be
refused whatever its FLOPs; a kernel that does less arithmetic than the reference at every size
(an exact algebraic rewrite: sum(x @ W, 1) as x @ W.sum(0)) is checked like any other and passes.

The rule, per bench case:
- every kernel that runs there also runs at some check case of the split (by its body: a kernel's
  name may carry its shapes);
- at some check case, the same set of kernels runs or fewer (none is left out at bench sizes);
- each kernel computes at least the kinds of work (matmuls, transcendentals, reductions) it
  computes at some check case: a static branch on the size that drops a matmul is a shortcut.
Padding, masks and casts that only ragged check sizes need are not work and may come and go.
"""
from __future__ import annotations

from collections.abc import Iterable

from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
from evaluator.analysis.jaxpr_cost import HEAVY_PRIMITIVES, REDUCTION_PRIMITIVES, TRANSCENDENTAL_PRIMITIVES

WORK_PRIMITIVES = HEAVY_PRIMITIVES | REDUCTION_PRIMITIVES | TRANSCENDENTAL_PRIMITIVES


def work_kinds(call: PallasCallInfo) -> frozenset[str]:
    """The kinds of arithmetic a kernel body computes (its work primitives, anywhere inside)."""
    return frozenset(p for p in call.kernel_primitives if p in WORK_PRIMITIVES)


def kernels(summary: TraceSummary) -> dict[str, frozenset[str]]:
    """Kernel (PallasCallInfo.key) -> the union of its work kinds over its calls in the program."""
    out: dict[str, frozenset[str]] = {}
    for call in summary.pallas_calls:
        out[call.key] = out.get(call.key, frozenset()) | work_kinds(call)
    return out


def shortcut(bench: TraceSummary, checks: Iterable[tuple[str, TraceSummary]]) -> str | None:
    """Why `bench` is not the program the check cases ran (a sentence), or None when it is."""
    checks = list(checks)
    at_checks = [(name, kernels(s)) for name, s in checks]
    at_bench = kernels(bench)
    names = {c.key: c.name for s in (*(s for _, s in checks), bench) for c in s.pallas_calls}
    for key, kinds in at_bench.items():
        kernel = names[key]
        seen = [(name, ks[key]) for name, ks in at_checks if key in ks]
        if not seen:
            return (f"kernel {kernel} runs here but at no check case, so nothing it computes is ever "
                    "compared")
        if not any(kinds >= checked for _, checked in seen):
            name, checked = min(seen, key=lambda nc: len(nc[1] - kinds))
            missing = ", ".join(sorted(checked - kinds))
            return (f"kernel {kernel} no longer computes {missing} here, which it computes at check case "
                    f"{name}")
    if at_checks and not any(set(ks) <= set(at_bench) for _, ks in at_checks):
        name, ks = min(at_checks, key=lambda nk: len(set(nk[1]) - set(at_bench)))
        left_out = ", ".join(sorted(names[k] for k in set(ks) - set(at_bench)))
        return f"kernel(s) {left_out} of check case {name} do not run here"
    return None
