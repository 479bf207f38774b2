"""XLA's own TPU cost model for a reference, read from a libtpu compile for a named generation
(no TPU needed), and the pitfalls around it (docs/performance-model.md):

- `optimal_seconds` is a sum of per-instruction rooflines; custom calls count zero (a Pallas
  kernel, XLA's own online-softmax that attention references become). Their operand and result
  bytes, and the FLOPs our count of the reference has beyond XLA's, are priced by our model.
- Dots are priced at the bf16 peak whatever their operands: f32 matmuls get the f32 rate's extra time.
- Loop bodies count once: the FLOPs of the other iterations are in that same FLOP gap, and each
  iteration costs a fixed overhead (a calibrated constant).
- Some programs come out at zero or below (MLA attention): such a time is flagged, never used;
  XLA's FLOP and byte counts under our roofline stand in. Without any XLA figure (no libtpu, a
  failed compile) our model's time of the reference does.

`read_compiled` runs in the worker (evaluator/execution/handlers.py); the rest on the host.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluator.analysis.jaxpr_cost import Cost
from evaluator.performance.calibration import MIN_CALL_S, Calibration
from evaluator.performance.hardware import TpuGeneration
from evaluator.performance.perf_model import compute_time, conv_extra_time

# Custom calls that do no work of their own: buffer allocation and index hints.
BOOKKEEPING_CALLS = frozenset({"AllocateBuffer", "AssumeGatherIndicesInBound", "Sharding", "SPMDFullToShardShape",
                               "SPMDShardToFullShape", "MoveToHost", "MoveToDevice", "annotate_device_placement"})
# XLA's FLOP count below ours by more than this share: work it did not price (custom calls,
# loop bodies counted once). Smaller gaps are counting conventions (a reduction's first element).
FLOP_GAP_SHARE = 0.02
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
             "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


@dataclass
class XlaProgramCost:
    """What XLA's cost model says of one compiled program (plain values: it crosses the wire)."""

    optimal_s: float
    flops: float
    bytes_accessed: float
    transcendentals: float
    custom_calls: list[str] = field(default_factory=list)  # targets of the calls that do work
    custom_call_bytes: float = 0.0  # their operands' and results' bytes, which XLA prices at zero
    while_loops: int = 0
    declared_costs: int = 0  # custom calls carrying a pl.CostEstimate, which XLA prices verbatim


def read_compiled(compiled: Any) -> XlaProgramCost:
    """The cost analysis of a `jax.stages.Compiled`, and the custom calls of its HLO."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax: one dict per program
        analysis = analysis[0] if analysis else {}
    cost = XlaProgramCost(optimal_s=float(analysis.get("optimal_seconds", -1.0)),
                          flops=float(analysis.get("flops", 0.0)),
                          bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
                          transcendentals=float(analysis.get("transcendentals", 0.0)))
    read_hlo(compiled.as_text(), cost)
    return cost


def read_hlo(text: str, cost: XlaProgramCost) -> None:
    """Custom calls that do work and their bytes, and while loops, from compiled HLO text."""
    sizes: dict[str, float] = {}
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, result_type, op, rest = m.groups()
        sizes[name] = _type_bytes(result_type)
        if op == "while":
            cost.while_loops += 1
        if op != "custom-call":
            continue
        target = _TARGET.search(rest)
        if target is None or target.group(1) in BOOKKEEPING_CALLS:
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        cost.custom_calls.append(target.group(1))
        cost.declared_costs += '"cost_estimate"' in rest
        cost.custom_call_bytes += sizes[name] + sum(sizes.get(o, 0.0) for o in operands)


def _type_bytes(hlo_type: str) -> float:
    """Bytes of an HLO result type: an array `f32[4,128]{...}` or a tuple of them."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(hlo_type):
        itemsize = _ITEMSIZE.get(dtype, 1 if dtype.startswith("f8") else 0)
        total += itemsize * math.prod(int(d) for d in dims.split(",") if d)
    return total


@dataclass
class ReferenceTime:
    """The predicted time of the XLA reference at one case, and how it was reached."""

    time_s: float
    method: str  # "xla" (XLA's cost model, its gaps priced by ours) or "model" (ours alone)
    notes: list[str] = field(default_factory=list)


def price_reference(xla: XlaProgramCost | None, ours: ReferenceWork, ideal_bytes: float, gen: TpuGeneration,
                    calibration: Calibration, unavailable: str = "") -> ReferenceTime:
    """XLA's time for the reference, its pitfalls handled; `ours` is our count of what the
    reference computes (evaluator/truth/reference.py), `ideal_bytes` its inputs and outputs
    once. Without a usable XLA figure (`unavailable` says why) our roofline of the reference."""
    bandwidth = gen.hbm_bytes_per_s * calibration.hbm_efficiency
    loops_s = ours.loop_iterations * calibration.loop_iteration_s
    if xla is None:
        convs_s = conv_extra_time(ours.conv_flops, ours.conv_mxu_flops, gen, calibration.conv_efficiency)
        seconds = max(compute_time(ours.flops + ours.multipass_flops, ours.f32_matmul_flops, gen,
                                   calibration.f32_matmul_share) + convs_s,
                      ideal_bytes / bandwidth)
        return ReferenceTime(max(seconds + loops_s, MIN_CALL_S) + calibration.dispatch_s, "model",
                             [unavailable] if unavailable else [])
    priced = price_program(xla, ours, gen, calibration)
    notes = priced.notes
    call_s = xla.custom_call_bytes / bandwidth
    if xla.custom_calls:
        notes.append(f"custom calls {sorted(set(xla.custom_calls))} priced by their bytes")
    if loops_s:
        notes.append(f"{ours.loop_iterations:,.0f} loop iterations at {calibration.loop_iteration_s * 1e6:.2g} us")
    return ReferenceTime(max(priced.seconds + max(priced.gap_s, call_s) + loops_s, MIN_CALL_S)
                         + calibration.dispatch_s, "xla", notes)


@dataclass
class ProgramTime:
    """XLA's cost-model time for a compiled program with what it leaves out priced by us."""

    seconds: float  # its own time, with f32 matmuls, extra MXU passes and convolutions repriced
    gap_s: float    # the FLOPs our count has beyond XLA's (custom calls, loop bodies counted once)
    notes: list[str]


def price_program(xla: XlaProgramCost, ours: ReferenceWork, gen: TpuGeneration,
                  calibration: Calibration) -> ProgramTime:
    """XLA's time for a program whose work we counted as `ours`: a reference, or the glue around a
    candidate's kernels (evaluator/performance/prediction.py)."""
    notes: list[str] = []
    if math.isfinite(xla.optimal_s) and xla.optimal_s > 0:
        seconds = xla.optimal_s / calibration.xla_efficiency
    elif not xla.flops and not xla.bytes_accessed:
        seconds = 0.0  # nothing outside its custom calls (XLA then gives no time, or -1)
    else:  # never used: XLA's own FLOP and byte counts under our roofline stand in
        bandwidth = gen.hbm_bytes_per_s * calibration.hbm_efficiency
        seconds = max(xla.flops / gen.bf16_flops_per_s, xla.bytes_accessed / bandwidth) / calibration.xla_efficiency
        notes.append(f"XLA's cost model gave {xla.optimal_s:.3g} s, not physical: not used; its FLOP and byte "
                     "counts priced by our roofline instead")
    if ours.f32_matmul_flops:
        # XLA prices every dot at the bf16 peak; a chip runs f32 operands at the f32 share of it.
        seconds += ours.f32_matmul_flops / gen.bf16_flops_per_s * (1 / calibration.f32_matmul_share - 1)
        notes.append(f"{ours.f32_matmul_flops / 1e9:.3g} GFLOP of f32 matmuls at the f32 rate, not XLA's bf16 peak")
    if ours.multipass_flops:
        # XLA prices a dot once whatever its precision; HIGH and HIGHEST run it in 3 or 6 passes.
        seconds += ours.multipass_flops / gen.bf16_flops_per_s
        notes.append(f"{ours.multipass_flops / 1e9:.3g} GFLOP of extra MXU passes (dots at HIGH or HIGHEST "
                     "precision), which XLA's model leaves out")
    if ours.conv_flops:
        # XLA prices a convolution's FLOPs (not the taps on a dilation's zeros) at the peak,
        # whatever its feature counts.
        seconds += conv_extra_time(ours.conv_flops - ours.conv_skipped_flops, ours.conv_mxu_flops, gen,
                                   calibration.conv_efficiency)
        notes.append(f"{ours.conv_mxu_flops / 1e9:.3g} GFLOP of convolutions as the MXU runs them, at "
                     f"{calibration.conv_efficiency:.2g} of the peak")
    gap_flops = ours.flops - ours.conv_skipped_flops - xla.flops
    gap_s = 0.0
    if gap_flops > FLOP_GAP_SHARE * ours.flops:
        # Work in custom calls (a Mosaic kernel like ours: priced as our kernels are) or in the
        # iterations of loop bodies XLA counted once.
        gap_s = gap_flops / (gen.bf16_flops_per_s * calibration.compute_efficiency)
        notes.append(f"{gap_flops / 1e9:.3g} GFLOP XLA's model did not price (custom calls, loop bodies "
                     "counted once): priced by ours")
    return ProgramTime(seconds, gap_s, notes)


@dataclass
class ReferenceWork:
    """Our count of what a reference computes (evaluator.analysis.jaxpr_cost.Cost), as much as
    pricing it needs."""

    flops: float
    f32_matmul_flops: float
    loop_iterations: float
    conv_flops: float = 0.0
    conv_mxu_flops: float = 0.0
    conv_skipped_flops: float = 0.0
    multipass_flops: float = 0.0  # beyond flops: dots' extra MXU passes (jaxpr_cost.mxu_passes)

    @classmethod
    def of(cls, cost: Cost) -> "ReferenceWork":
        return cls(cost.flops, cost.f32_matmul_flops, cost.loop_iterations, cost.conv_flops, cost.conv_mxu_flops,
                   cost.conv_skipped_flops, cost.multipass_flops)


class XlaCostCache:
    """Compiled costs by content: one JSON file per (reference code, case, generation, versions).

    Where: `$PALLAS_KERNEL_GYM_XLA_COSTS`, else `$XDG_CACHE_HOME/pallas-kernel-gym/xla-costs`
    (~/.cache by default). Concurrent writers replace whole files, so readers never see half.
    Below it, read-only, a `shipped` file of entries committed with the project (our own tasks'
    references at their bench cases): a fresh clone prices them without compiling.
    """

    def __init__(self, folder: str | Path | None = None, shipped: Path | None = None):
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        self.folder = Path(folder or os.environ.get("PALLAS_KERNEL_GYM_XLA_COSTS")
                           or Path(base) / "pallas-kernel-gym" / "xla-costs")
        self.shipped_path = shipped
        self._shipped: dict[str, dict] | None = None

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    @staticmethod
    def entry(value: XlaProgramCost | str) -> dict[str, Any]:
        """A value as it is stored: {"cost": ...} or {"error": ...}."""
        return {"error": value} if isinstance(value, str) else {"cost": asdict(value)}

    def shipped(self) -> dict[str, dict]:
        """The committed entries by key (none when there is no such file)."""
        if self._shipped is None:
            try:
                self._shipped = json.loads(self.shipped_path.read_text()) if self.shipped_path else {}
            except (OSError, ValueError):
                self._shipped = {}
        return self._shipped

    def get(self, key: str) -> XlaProgramCost | str | None:
        """The cost, or the compile error recorded for it, or None if never compiled."""
        try:
            data = json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            data = self.shipped().get(key)
            if data is None:
                return None
        return data["error"] if "error" in data else XlaProgramCost(**data["cost"])

    def put(self, key: str, value: XlaProgramCost | str) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(self.entry(value)))
            tmp.replace(self.folder / f"{key}.json")
        except OSError:
            pass  # a read-only home: compile again next time
