"""How long a worker may run one case: a limit that follows the work, up to a ceiling.

TPU interpret mode runs a kernel step by step on the CPU, and what it costs is counted in
what the kernel does, not in its arithmetic: a fixed cost per grid step (copying blocks in
and out) and a host callback per memory access of the body (a load, a store, a DMA or a
semaphore op), each loop iteration counted. A sequential kernel (a scan that walks one time
step per loop iteration, as recurrentgemma's RG-LRU kernel does) makes thousands of accesses
per grid step and is slow for being sequential, not for being wrong; a hang is a loop with no
end, which counts once (its trip count is unknown) and keeps the base limit.

Measured on the development machine, with the race detector on: about 3.5 ms per
grid step and 1.7 ms per access (tests/candidates/correct_step_scan.py: 10,264 accesses in
17.8 s). The race detector adds a cost that can grow with the square of a call's accesses: each
access is checked against what the call did before it, over all its grid steps. jax's own check
does that one Python call per earlier access (with jax 0.10.2: a scalar loop's 2,000 / 4,000 /
8,000 accesses took 9.3 / 36 / 144 s with it, 0.5 s for 2,000 without it; moe_unpermute's
solution, 13,775 accesses in three steps, 90-115 s against 4.5 s without). The worker's check
(jax_hooks.AccessLog) holds an access against all earlier ones in one numpy comparison, and
against none while the buffer's accesses so far are all before it: the scalar loop's 2,000 /
8,000 / 32,000 accesses took 0.9 / 3.7 / 10.4 s, moe_unpermute's 6 s; with every access held
against the whole log, 1.0 / 5.1 / 47.6 s (RACE_PAIR_S, the quadratic term where copies keep
the fast path from applying). The limit grants SAFETY times that for every seed on top of the
base step limit, so a loaded machine does not turn a slow kernel into a `timeout`.
"""
from __future__ import annotations

from dataclasses import dataclass

from evaluator.analysis.jaxpr_analysis import TraceSummary

GRID_STEP_S = 3.5e-3  # interpret mode's cost of one grid step, before any access
ACCESS_S = 1.7e-3     # one memory access of the kernel body with the race detector on
RACE_PAIR_S = 4e-8    # with the race detector on, times the square of one call's accesses
SAFETY = 3.0          # headroom for slower or busier machines


@dataclass(frozen=True)
class RunLimit:
    """The limit for running one case, and why it is that long (the verdict says so)."""

    seconds: float
    base_s: float
    grid_steps: float
    accesses: float
    capped: bool
    race_detector: bool = False  # on for this run: its cost grows with the square of the accesses

    def describe(self) -> str:
        if self.seconds <= self.base_s:
            return f"the step limit of {self.base_s:g} s"
        text = (f"{self.seconds:g} s: {self.base_s:g} s plus {SAFETY:g}x the interpret-mode cost of "
                f"{self.grid_steps:,.0f} grid steps and {self.accesses:,.0f} memory accesses per seed"
                + (", race detector on" if self.race_detector else ""))
        return text + " (capped at the ceiling)" if self.capped else text


def interpret_work(summary: TraceSummary) -> tuple[float, float]:
    """(grid steps, memory accesses) of one run of a case's kernels, every loop counted."""
    steps = accesses = 0.0
    for call in summary.pallas_calls:
        runs = call.grid_steps * call.runs
        steps += runs
        accesses += runs * call.accesses_per_step
    return steps, accesses


def race_detector_s(summary: TraceSummary) -> float:
    """What the race detector adds to one run of a case's kernels: it is on for the whole program
    when any call may race, and each call's cost is quadratic in its accesses."""
    if not summary.races_possible:
        return 0.0
    return sum(call.runs * RACE_PAIR_S * (call.grid_steps * call.accesses_per_step) ** 2
               for call in summary.pallas_calls)


def run_limit(summary: TraceSummary | None, n_seeds: int, base_s: float, ceiling_s: float) -> RunLimit:
    """The time to grant a Run of `n_seeds` seeds of a case whose trace is `summary`."""
    steps, accesses = interpret_work(summary) if summary is not None else (0.0, 0.0)
    races_s = race_detector_s(summary) if summary is not None else 0.0
    work_s = round(SAFETY * max(n_seeds, 1) * (steps * GRID_STEP_S + accesses * ACCESS_S + races_s))  # whole seconds
    wanted = base_s + work_s
    seconds = max(base_s, min(wanted, ceiling_s))
    return RunLimit(seconds, base_s, steps, accesses, capped=wanted > ceiling_s, race_detector=races_s > 0)
