"""Predicted speedup over XLA without a TPU: our model's time for the candidate's program (its
Pallas kernels from their grids and blocks, the glue around them from its FLOPs and bytes,
matmuls left to XLA included) against XLA's own cost model's time for the reference
(evaluator/performance/xla_cost.py), both with the calibrated constants
(evaluator/performance/calibration.py). `speedup` stays the measured one, on a TPU only.

Each case keeps the figures its prediction was computed from (`CaseInputs`), so a refit of the
constants (`python -m evaluator calibrate`) recomputes predictions without grading again.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from evaluator.analysis.jaxpr_cost import Cost
from evaluator.performance.calibration import MIN_CALL_S, Calibration
from evaluator.performance.hardware import TpuGeneration
from evaluator.performance.perf_model import PerfEstimate, compute_time, conv_extra_time
from evaluator.performance.xla_cost import ReferenceWork, XlaProgramCost, price_reference

METHODS = {"xla": "our model for the kernels, XLA's TPU cost model for the reference",
           "model": "our model for the kernels and the reference (no XLA cost: see the notes)"}


@dataclass
class KernelWork:
    flops: float
    f32_matmul_flops: float
    hbm_bytes: float
    grid_steps: float  # over all its runs
    multipass_flops: float = 0.0  # beyond flops: its dots' extra MXU passes


@dataclass
class CaseInputs:
    """What one case's prediction is computed from."""

    kernels: list[KernelWork]
    glue_flops: float
    glue_f32_matmul_flops: float
    glue_bytes: float
    reference: ReferenceWork
    ideal_bytes: float
    xla: XlaProgramCost | None
    xla_unavailable: str = ""  # why there is no XLA figure
    glue_conv_flops: float = 0.0  # of glue_flops: convolutions left to XLA, and as the MXU runs them
    glue_conv_mxu_flops: float = 0.0
    glue_multipass_flops: float = 0.0  # beyond glue_flops: the extra MXU passes of its dots

    @classmethod
    def of(cls, est: PerfEstimate, reference: Cost, xla: XlaProgramCost | str) -> "CaseInputs":
        return cls([KernelWork(k.flops, k.f32_matmul_flops, k.hbm_bytes, k.grid_steps * k.runs, k.multipass_flops)
                    for k in est.kernels],
                   est.glue_flops, est.glue_f32_matmul_flops, est.glue_bytes, ReferenceWork.of(reference),
                   est.ideal_bytes, xla if isinstance(xla, XlaProgramCost) else None,
                   xla if isinstance(xla, str) else "", est.glue_conv_flops, est.glue_conv_mxu_flops,
                   est.glue_multipass_flops)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CaseInputs":
        data = dict(data)
        data["kernels"] = [KernelWork(**k) for k in data["kernels"]]
        data["reference"] = ReferenceWork(**data["reference"])
        data["xla"] = XlaProgramCost(**data["xla"]) if data.get("xla") else None
        return cls(**data)


@dataclass
class CasePrediction:
    kernel_s: float
    xla_s: float
    speedup: float  # xla_s / kernel_s
    bound: str      # what dominates the kernel's time: compute, memory, step overhead, dispatch
    xla_method: str  # "xla" or "model" (xla_cost.ReferenceTime.method)
    notes: list[str] = field(default_factory=list)
    inputs: CaseInputs | None = None


@dataclass
class PredictedSpeedup:
    """The verdict's `predicted_speedup`: the median over bench cases, as `speedup` is."""

    overall: float
    generation: str
    method: str
    cases: dict[str, CasePrediction]
    label: str = "predicted, static"  # how reports head the figure: never a measurement


def kernel_time(inputs: CaseInputs, gen: TpuGeneration, calibration: Calibration) -> tuple[float, str]:
    """(seconds, bound) of a candidate's program at one case: each kernel a roofline at the
    calibrated rates plus its grid steps, the glue a roofline, one after another, and the
    host's cost of the call."""
    bandwidth = gen.hbm_bytes_per_s * calibration.hbm_efficiency
    parts = {"compute": 0.0, "memory": 0.0, "step overhead": 0.0}
    total = 0.0
    for k in inputs.kernels:
        compute = compute_time(k.flops + k.multipass_flops, k.f32_matmul_flops, gen, calibration.f32_matmul_share) / (
            calibration.compute_efficiency)
        memory = k.hbm_bytes / bandwidth
        steps = k.grid_steps * calibration.grid_step_s
        parts["compute"] += compute
        parts["memory"] += memory
        parts["step overhead"] += steps
        total += max(compute, memory) + steps
    glue_compute = (compute_time(inputs.glue_flops + inputs.glue_multipass_flops, inputs.glue_f32_matmul_flops, gen,
                                 calibration.f32_matmul_share)
                    + conv_extra_time(inputs.glue_conv_flops, inputs.glue_conv_mxu_flops, gen,
                                      calibration.conv_efficiency))
    glue_memory = inputs.glue_bytes / bandwidth
    parts["compute"] += glue_compute
    parts["memory"] += glue_memory
    total += max(glue_compute, glue_memory)
    parts["dispatch"] = calibration.dispatch_s
    return max(total, MIN_CALL_S) + calibration.dispatch_s, max(parts, key=parts.__getitem__)


def predict_case(inputs: CaseInputs, gen: TpuGeneration, calibration: Calibration) -> CasePrediction:
    seconds, bound = kernel_time(inputs, gen, calibration)
    reference = price_reference(inputs.xla, inputs.reference, inputs.ideal_bytes, gen, calibration,
                                inputs.xla_unavailable)
    return CasePrediction(seconds, reference.time_s, reference.time_s / seconds, bound, reference.method,
                          reference.notes, inputs)


def overall(cases: dict[str, CasePrediction], gen: TpuGeneration) -> PredictedSpeedup:
    method = "xla" if all(c.xla_method == "xla" for c in cases.values()) else "model"
    return PredictedSpeedup(statistics.median(c.speedup for c in cases.values()), gen.name, METHODS[method],
                            cases, f"predicted, {gen.name}, static")
