"""Predicted speedup over XLA without a TPU: our model's time for the candidate's program (its
Pallas kernels from their grids and blocks; the glue around them, matmuls and convolutions left to
XLA included, by XLA's cost model of the candidate's compiled program where libtpu compiled it,
else by our count of its FLOPs and bytes) against XLA's own cost model's time for the reference
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
from evaluator.performance.perf_model import KernelEstimate, PerfEstimate, compute_time, conv_extra_time
from evaluator.performance.xla_cost import ReferenceWork, XlaProgramCost, price_program, price_reference

METHODS = {"xla": "our model for the kernels, XLA's TPU cost model for the reference",
           "model": "our model for the kernels and the reference (no XLA cost: see the notes)"}


@dataclass
class KernelWork:
    flops: float
    f32_matmul_flops: float
    hbm_bytes: float
    grid_steps: float  # over all its runs
    multipass_flops: float = 0.0  # beyond flops: its dots' extra MXU passes
    mxu_padding_flops: float = 0.0  # and its dots' operands padded to whole MXU tiles
    vector_flops: float = 0.0  # of flops: all but matmuls

    @classmethod
    def of(cls, k: KernelEstimate) -> "KernelWork":
        return cls(k.flops, k.f32_matmul_flops, k.hbm_bytes, k.grid_steps * k.runs, k.multipass_flops,
                   k.mxu_padding_flops, k.vector_flops)


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
    glue_conv_skipped_flops: float = 0.0  # of glue_conv_flops: taps on a transposed convolution's zeros
    # XLA's cost model of the candidate's whole program, compiled by libtpu at this case (the
    # lowering stage's compile): its kernels are custom calls it prices at zero, so it is the glue
    glue_xla: XlaProgramCost | None = None

    @classmethod
    def of(cls, est: PerfEstimate, reference: Cost, xla: XlaProgramCost | str,
           glue_xla: XlaProgramCost | None = None) -> "CaseInputs":
        return cls([KernelWork.of(k) for k in est.kernels],
                   est.glue_flops, est.glue_f32_matmul_flops, est.glue_bytes, ReferenceWork.of(reference),
                   est.ideal_bytes, xla if isinstance(xla, XlaProgramCost) else None,
                   xla if isinstance(xla, str) else "", est.glue_conv_flops, est.glue_conv_mxu_flops,
                   est.glue_multipass_flops, est.glue_conv_skipped_flops, glue_xla)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CaseInputs":
        data = dict(data)
        data["kernels"] = [KernelWork(**k) for k in data["kernels"]]
        data["reference"] = ReferenceWork(**data["reference"])
        for name in ("xla", "glue_xla"):
            data[name] = XlaProgramCost(**data[name]) if data.get(name) else None
        return cls(**data)

    @property
    def glue_work(self) -> ReferenceWork:
        """Our count of the glue's work, as XLA's figure for it is priced (xla_cost.price_program)."""
        return ReferenceWork(self.glue_flops, self.glue_f32_matmul_flops, 0.0, self.glue_conv_flops,
                             self.glue_conv_mxu_flops, self.glue_conv_skipped_flops, self.glue_multipass_flops)


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
    calibrated rates plus its grid steps, the glue (`glue_time`), one after another, and the
    host's cost of the call. Where the vector units' rate was measured, a kernel's compute is
    its MXU work at the calibrated share of the peak and then its vector work at that rate (a
    softmax's exp and reductions wait for the scores, the next matmul waits for them)."""
    bandwidth = gen.hbm_bytes_per_s * calibration.hbm_efficiency
    parts = {"compute": 0.0, "memory": 0.0, "step overhead": 0.0}
    total = 0.0
    for k in inputs.kernels:
        mxu_extra = k.multipass_flops + k.mxu_padding_flops
        vector = k.vector_flops if calibration.vector_flops_per_s else 0.0
        compute = compute_time(k.flops - vector + mxu_extra, k.f32_matmul_flops, gen,
                               calibration.f32_matmul_share) / calibration.compute_efficiency
        compute += vector / calibration.vector_flops_per_s if vector else 0.0
        memory = k.hbm_bytes / bandwidth
        steps = k.grid_steps * calibration.grid_step_s
        parts["compute"] += compute
        parts["memory"] += memory
        parts["step overhead"] += steps
        total += max(compute, memory) + steps
    glue_compute, glue_memory = glue_time(inputs, gen, calibration)
    parts["compute"] += glue_compute
    parts["memory"] += glue_memory
    total += max(glue_compute, glue_memory)
    parts["dispatch"] = calibration.dispatch_s
    return max(total, MIN_CALL_S) + calibration.dispatch_s, max(parts, key=parts.__getitem__)


def glue_time(inputs: CaseInputs, gen: TpuGeneration, calibration: Calibration) -> tuple[float, float]:
    """(compute, memory) seconds of the glue around the kernels; the glue takes the larger.
    XLA's cost model of the candidate's compiled program where there is one (it sees the layout
    copies into and out of the kernels, which our count of fused glue does not), its gaps priced
    as a reference's are; else a roofline of our count."""
    xla = inputs.glue_xla
    if xla is not None and not xla.declared_costs:  # a declared pl.CostEstimate is in XLA's figure
        priced = price_program(xla, inputs.glue_work, gen, calibration)
        seconds = priced.seconds + priced.gap_s
        memory_bound = xla.bytes_accessed / gen.hbm_bytes_per_s >= xla.flops / gen.bf16_flops_per_s
        return (0.0, seconds) if memory_bound else (seconds, 0.0)
    compute = (compute_time(inputs.glue_flops + inputs.glue_multipass_flops, inputs.glue_f32_matmul_flops, gen,
                            calibration.f32_matmul_share)
               + conv_extra_time(inputs.glue_conv_flops, inputs.glue_conv_mxu_flops, gen, calibration.conv_efficiency))
    return compute, inputs.glue_bytes / (gen.hbm_bytes_per_s * calibration.hbm_efficiency)


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
