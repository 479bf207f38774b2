"""A static performance model for Pallas TPU kernels: an estimate, not a measurement.

From the kernel's grid, block specs and dtypes (evaluator/analysis/traffic.py) and a generation's
published figures (evaluator/performance/hardware.py) it estimates HBM bytes moved, FLOPs, arithmetic
intensity and a roofline time, and sets them against an *ideal* kernel for the same case:
each input read once, each output written once, the reference's FLOPs. Assumptions, in
docs/performance-model.md: one roofline per pallas_call (time = max(compute time,
bytes / bandwidth)) plus a fixed cost per grid step, kernels run one after another, glue
outside kernels costs its bytes, matmuls on float32 operands run at a share of the bf16 peak
and everything else at the bf16 peak, blocks whose index maps read prefetched scalars are
charged a fetch on every grid step, a manual DMA moves its (indexed) destination's bytes, a
loop whose trip count depends on data runs its maximum number of times (evaluator/analysis/intervals.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
from evaluator.analysis.jaxpr_cost import Cost
from evaluator.performance.hardware import F32_MATMUL_SHARE, GRID_STEP_S, TpuGeneration
from tasks.spec import ArgSpec, np_dtype


@dataclass
class KernelEstimate:
    name: str
    grid_steps: int
    hbm_bytes: float
    flops: float
    time_s: float
    data_dependent: bool  # some index maps read prefetched scalars: traffic is an upper bound
    # A loop in the body has no known maximum trip count and counted once: the FLOPs and DMA
    # bytes are lower bounds.
    data_dependent_trips: bool = False
    # What such a count depends on when not only the task's bounded integer inputs ("float
    # data"); '' otherwise. Only those inputs leave the 0.8x-ideal rule undecided.
    unbounded_trips_from: str = ""
    f32_matmul_flops: float = 0.0  # of flops: matmuls on float32 operands
    runs: float = 1.0  # times the call runs (loops around it outside kernels)
    multipass_flops: float = 0.0  # beyond flops: dots' extra MXU passes (the speed prediction prices them)
    mxu_padding_flops: float = 0.0  # and dots' operands padded to whole MXU tiles (likewise)
    vector_flops: float = 0.0  # of flops: all but matmuls


@dataclass
class PerfEstimate:
    case: str
    generation: str
    hbm_bytes: float
    flops: float
    arithmetic_intensity: float  # FLOPs per HBM byte
    time_s: float
    ideal_bytes: float
    ideal_flops: float
    ideal_time_s: float
    slowdown_vs_ideal: float  # time_s / ideal_time_s: 1.0 is as good as the model can tell
    bound: str  # "memory" or "compute", for the estimate
    kernels: list[KernelEstimate]
    # The ideal kernel with every matmul at the bf16 rate (an f32 task's kernel may feed the
    # MXU bf16 operands: at default precision that is what the chip computes anyway) and only
    # the FLOPs the task needs (Task.necessary_flops_share: causal attention may skip half).
    # No kernel doing the task's work can be faster than this.
    floor_time_s: float = 0.0
    grid_steps: int = 0  # over all kernels and their runs, each costing GRID_STEP_S
    # The glue outside kernels, as the speed prediction prices it (evaluator/performance/prediction.py):
    # its FLOPs with the matmuls and convolutions left to XLA, and its bytes once XLA fused it.
    glue_flops: float = 0.0
    glue_f32_matmul_flops: float = 0.0
    glue_bytes: float = 0.0
    glue_conv_flops: float = 0.0      # of glue_flops: convolutions,
    glue_conv_mxu_flops: float = 0.0  # and the same with their feature dims padded to MXU tiles
    glue_multipass_flops: float = 0.0  # beyond glue_flops: its dots' extra MXU passes
    glue_conv_skipped_flops: float = 0.0  # of glue_conv_flops: taps on a transposed convolution's zeros

    @property
    def lower_bound(self) -> bool:
        """Some kernel loop ran an unknown number of times and counted once."""
        return any(k.data_dependent_trips for k in self.kernels)

    def summary(self) -> str:
        mib = 1 << 20
        caveat = (" (a lower bound: a kernel loop's trip count depends on data the model cannot "
                  "bound)" if self.lower_bound else "")
        return (f"static estimate on {self.generation} at {self.case}: {self.time_s * 1e3:.3g} ms "
                f"({self.bound}-bound, {self.hbm_bytes / mib:,.0f} MiB moved, "
                f"{self.flops / 1e9:,.1f} GFLOP, {self.grid_steps:,} grid steps){caveat}, {self.slowdown_vs_ideal:.2f}x the ideal "
                f"kernel's {self.ideal_time_s * 1e3:.3g} ms ({self.ideal_bytes / mib:,.0f} MiB)")


def kernel_estimate(call: PallasCallInfo, gen: TpuGeneration) -> KernelEstimate:
    steps = call.grid_steps
    moved, data_dependent = 0.0, False
    for block in call.blocks:
        if block.memory_space != "vmem":
            continue  # pl.ANY / SMEM operands: moved by the kernel's own DMAs, counted below
        fetches = block.fetches
        if fetches is None:
            fetches, data_dependent = steps, True
        moved += fetches * math.prod(block.block_shape) * np_dtype(block.dtype).itemsize
    moved = (moved + call.dma_bytes_per_step * steps) * call.runs
    flops = call.flops
    time_s = roofline(flops, moved, gen, call.f32_matmul_flops) + steps * call.runs * GRID_STEP_S
    return KernelEstimate(call.name, steps, moved, flops, time_s, data_dependent,
                          call.data_dependent_trips, call.unbounded_trips_from, call.f32_matmul_flops, call.runs,
                          call.multipass_flops, call.mxu_padding_flops, call.vector_flops)


def estimate(case_name: str, summary: TraceSummary, gen: TpuGeneration, reference: Cost,
             args: list[ArgSpec], outs: list[ArgSpec], necessary_flops_share: float = 1.0
             ) -> PerfEstimate:
    """`reference`: the reference's cost (evaluator/truth/reference.py) whose FLOPs and matmul FLOPs
    the ideal kernel does, its matmuls at the f32 rate when the first argument is f32.
    `necessary_flops_share` (Task.necessary_flops_share) scales the FLOPs of the floor."""
    kernels = [kernel_estimate(c, gen) for c in summary.pallas_calls]
    outside = summary.outside
    glue_bytes = outside.bytes_accessed
    hbm = sum(k.hbm_bytes for k in kernels) + glue_bytes
    flops = sum(k.flops for k in kernels) + outside.flops
    f32_matmul = sum(c.f32_matmul_flops for c in summary.pallas_calls) + outside.f32_matmul_flops
    time_s = sum(k.time_s for k in kernels) + roofline(outside.flops, glue_bytes, gen,
                                                       outside.f32_matmul_flops)
    ideal_bytes = float(sum(math.prod(a.shape) * np_dtype(a.dtype).itemsize for a in (*args, *outs)))
    # The ideal's matmuls run at the rate of the task's main operand (its first argument: x,
    # q, lhs), not of any f32 side input (attention backward's lse, int8 matmul's scales).
    f32_case = bool(args) and args[0].dtype == "float32"
    ideal_time = roofline(reference.flops, ideal_bytes, gen,
                          reference.matmul_flops if f32_case else 0.0)
    return PerfEstimate(
        case=case_name, generation=gen.name, hbm_bytes=hbm, flops=flops,
        arithmetic_intensity=flops / hbm if hbm else float("inf"), time_s=time_s,
        ideal_bytes=ideal_bytes, ideal_flops=reference.flops, ideal_time_s=ideal_time,
        slowdown_vs_ideal=time_s / ideal_time if ideal_time else float("inf"),
        bound="compute" if compute_time(flops, f32_matmul, gen) >= hbm / gen.hbm_bytes_per_s
        else "memory", kernels=kernels,
        floor_time_s=roofline(reference.flops * necessary_flops_share, ideal_bytes, gen),
        grid_steps=int(sum(c.grid_steps * c.runs for c in summary.pallas_calls)),
        glue_flops=outside.flops + outside.heavy_flops, glue_f32_matmul_flops=outside.f32_matmul_flops,
        glue_bytes=min(glue_bytes, summary.glue_fused_bytes), glue_conv_flops=outside.conv_flops,
        glue_conv_mxu_flops=outside.conv_mxu_flops, glue_multipass_flops=outside.multipass_flops,
        glue_conv_skipped_flops=outside.conv_skipped_flops)


def compute_time(flops: float, f32_matmul_flops: float, gen: TpuGeneration,
                 f32_matmul_share: float = F32_MATMUL_SHARE) -> float:
    """Seconds of arithmetic: f32-operand matmuls at `f32_matmul_share` of the bf16 peak, the
    rest at the peak (elementwise work too: the model does not split out the vector units)."""
    return ((flops - f32_matmul_flops) / gen.bf16_flops_per_s
            + f32_matmul_flops / (gen.bf16_flops_per_s * f32_matmul_share))


def conv_extra_time(priced_flops: float, conv_mxu_flops: float, gen: TpuGeneration, conv_efficiency: float) -> float:
    """What convolutions cost beyond the `priced_flops` of them already at the bf16 peak: the MXU
    runs them with their feature dims padded to whole tiles and without the taps on an lhs
    dilation's zeros (jaxpr_cost.conv_mxu_flops), at `conv_efficiency` of the peak (a calibrated
    constant: what the roofline does not see of windows and strides). Negative where the priced
    FLOPs counted taps on zeros."""
    return (conv_mxu_flops / conv_efficiency - priced_flops) / gen.bf16_flops_per_s


def roofline(flops: float, hbm_bytes: float, gen: TpuGeneration, f32_matmul_flops: float = 0.0
             ) -> float:
    return max(compute_time(flops, f32_matmul_flops, gen), hbm_bytes / gen.hbm_bytes_per_s)


def worst_bench_case(estimates: dict[str, dict]) -> tuple[str, dict] | None:
    """(case, estimate) with the largest slowdown vs the ideal, from a verdict's
    `details["perf_model"]` (case name -> PerfEstimate as a dict); None if there is none."""
    if not estimates:
        return None
    return max(estimates.items(), key=lambda item: item[1]["slowdown_vs_ideal"])
