"""Predictions held against measured TPU times: the agreement figures, and the fit of the
calibration constants (evaluator/performance/calibration.py) to measured times.

Used by `python -m evaluator calibrate` (a TPU user's own `--backend tpu` timings) and by
benchmarks/perf_agreement.py (JAXBench's published v6e times). The fit is a coordinate search on
a log grid per constant, maximising the share of kernel and XLA times predicted within 2x of the
measurement: a handful of constants, no per-task table.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from evaluator.performance.calibration import Calibration
from evaluator.performance.hardware import TpuGeneration
from evaluator.performance.prediction import CaseInputs, predict_case

# Each constant's search range (low, high): physical bounds, not tuned to any task.
RANGES: dict[str, tuple[float, float]] = {
    "grid_step_s": (0.05e-6, 5e-6),
    "f32_matmul_share": (1 / 6, 1.0),
    "hbm_efficiency": (0.3, 1.0),
    "compute_efficiency": (0.2, 1.0),
    "xla_efficiency": (0.2, 2.0),
    "conv_efficiency": (0.1, 1.0),
    "loop_iteration_s": (0.1e-6, 20e-6),
    # Up to 2 ms: a virtualised TPU host (gVisor, v5e) took 0.6-0.8 ms per synchronised call.
    "dispatch_s": (1e-6, 2e-3),
    # A v5e's vector units ran 0.3-4 TFLOP/s of our count's work on resident blocks (grid_step_cost.py).
    "vector_flops_per_s": (0.1e12, 50e12),
}
# What one kernel's time is made of, which a chip's microbenchmarks measure (benchmarks/grid_step_cost.py
# fit): a generation's own calibration fits them there and the rest on model-written kernels.
KERNEL_SIDE = ("grid_step_s", "hbm_efficiency", "compute_efficiency", "vector_flops_per_s")
GRID_POINTS = 25
ROUNDS = 4


@dataclass
class Sample:
    """One measured case: what its prediction is computed from, and the times measured (either
    may be missing: a reference timed without a kernel, a kernel whose reference was not)."""

    name: str
    group: str
    inputs: CaseInputs
    kernel_s: float | None = None
    xla_s: float | None = None
    device_timed: bool = False  # timed by a device profiler, which does not see the host's dispatch


def as_measured(s: Sample, gen: TpuGeneration, calibration: Calibration) -> tuple[float, float, float]:
    """(kernel, XLA, speedup) predicted as the sample's timing method would measure them."""
    p = predict_case(s.inputs, gen, calibration)
    shift = calibration.dispatch_s if s.device_timed else 0.0
    return p.kernel_s - shift, p.xla_s - shift, (p.xla_s - shift) / (p.kernel_s - shift)


@dataclass
class Agreement:
    n: int
    within_2x: float         # share of predictions within a factor of 2 of the measurement
    median_ratio: float      # median predicted / measured
    spearman: float | None   # rank correlation, None under 3 points


def agreement(predicted: list[float], measured: list[float]) -> Agreement:
    pairs = [(p, m) for p, m in zip(predicted, measured) if p > 0 and m > 0]
    if not pairs:
        return Agreement(0, float("nan"), float("nan"), None)
    ratios = [p / m for p, m in pairs]
    return Agreement(len(pairs), sum(1 for r in ratios if 0.5 <= r <= 2.0) / len(pairs),
                     statistics.median(ratios), spearman([p for p, _ in pairs], [m for _, m in pairs]))


def spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else None


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def log_errors(samples: list[Sample], gen: TpuGeneration, calibration: Calibration) -> list[float]:
    """|log(predicted / measured)| of every measured time of every sample."""
    errors = []
    for s in samples:
        kernel_s, xla_s, _ = as_measured(s, gen, calibration)
        for predicted, measured in ((kernel_s, s.kernel_s), (xla_s, s.xla_s)):
            if measured:
                errors.append(abs(math.log(predicted / measured)))
    return errors


def fit(samples: list[Sample], gen: TpuGeneration, start: Calibration = Calibration(),
        constants: tuple[str, ...] = tuple(RANGES), fitted_on: str = "") -> Calibration:
    """The constants that put the most predictions within 2x of the measurement (ties: the
    least mean absolute log error), each in turn over its range, a few rounds; searched from
    `start` and from the model's assumptions (for the constants searched; the others are
    `start`'s), the better kept: a coordinate search can stall near where it starts (a large
    dispatch in use hid a smaller one and a slower XLA)."""
    def loss(c: Calibration) -> tuple[float, float]:
        errors = log_errors(samples, gen, c)
        if not errors:
            return (0.0, 0.0)
        return (-sum(1 for e in errors if e <= math.log(2)) / len(errors), statistics.fmean(errors))

    def search(best: Calibration) -> tuple[tuple[float, float], Calibration]:
        best_loss = loss(best)
        for _ in range(ROUNDS):
            for name in constants:
                low, high = RANGES[name]
                for i in range(GRID_POINTS):
                    value = low * (high / low) ** (i / (GRID_POINTS - 1))
                    trial = dataclasses.replace(best, **{name: value})
                    trial_loss = loss(trial)
                    if trial_loss < best_loss:
                        best, best_loss = trial, trial_loss
        return best_loss, best

    # The assumptions for the constants searched; the others stay as `start` has them.
    assumed = dataclasses.replace(Calibration(), **{f.name: getattr(start, f.name) for f in dataclasses.fields(Calibration)
                                                    if f.name not in constants})
    starts = [start] if start == assumed else [start, assumed]
    best = min((search(s) for s in starts), key=lambda found: found[0])[1]
    return dataclasses.replace(best, fitted_on=fitted_on or best.fitted_on)
