"""Stage 5: is each TPU feature a task requires really used by one of its kernels?

Declared is not used: a scratch buffer nobody reads, a prefetched scalar nobody looks at, one
tiny copy started and waited, a one-step axis marked parallel. Each rule below reads what the
worker found in the kernel (PallasCallInfo: the body's dataflow, evaluator/analysis/kernel_dataflow.py,
and at bench sizes the traffic model) and returns its evidence, which goes into the verdict.

- vmem_scratch: a VMEM scratch buffer is written and read back, and what is read reaches an
  output (stored there, or moved there by DMA), directly or through other buffers.
- scalar_prefetch: the prefetched scalars are read by an index map (they choose which block
  is fetched) or read by the body and used in a computation.
- manual_dma: a copy is started and waited, and what it copies into is read and reaches an
  output (a DMA whose destination nothing reads does nothing); at bench sizes, the body's own
  DMAs also move at least half of the bytes of the operands left outside the pipeline (memory
  space ANY).
- parallel_grid: at bench sizes, an axis marked parallel has more than one step; at check sizes
  (where a grid may be one step) an axis is marked parallel.
- input_output_aliases: an output is aliased to an input of the kernel (written in place over
  its buffer); at bench sizes the aliased inputs hold at least half of the bytes of the task's
  large inputs (aliasing a small side buffer leaves the large one copied).

And where the work is (check_feature): a tiny side kernel that stages one operand through
scratch, or DMAs the query, must not satisfy a requirement that the kernel doing the work
ignores. The feature must be used by one of the dominant kernels: the heaviest that together
carry at least half of the case's work, its FLOPs at bench sizes (the traffic model counts
them there), the bytes its kernels move otherwise (check sizes, or kernels that compute
nothing). For manual_dma at bench sizes the
DMAs must also move at least half of the bytes of the task's large inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from evaluator.analysis.jaxpr_analysis import PallasCallInfo
from tasks.spec import ArgSpec, np_dtype

# The share of the ANY operands' bytes the kernel's own DMAs must move at bench sizes.
MIN_DMA_SHARE = 0.5
# A required feature must be used by one of the heaviest kernels that together carry this share
# of a case's work (FLOPs, else bytes moved).
MIN_WORK_SHARE = 0.5
# A task input is large when it holds at least this share of all the inputs' bytes.
LARGE_OPERAND_SHARE = 0.1


@dataclass
class Evidence:
    """What one kernel shows of one feature: `used`, the facts, and why not when not."""

    used: bool
    facts: dict[str, Any] = field(default_factory=dict)
    why_not: str = ""


def _vmem_scratch(call: PallasCallInfo, bench: bool) -> Evidence:
    buffers = []
    for (shape, dtype, space), use in zip(call.scratch, call.scratch_use):
        if space == "vmem":
            buffers.append({"shape": shape, "dtype": dtype, "written": use.written, "read": use.read,
                            "reaches_output": use.reaches_output})
    facts = {"kernel": call.name, "vmem_scratch": buffers}
    if any(b["written"] and b["read"] and b["reaches_output"] for b in buffers):
        return Evidence(True, facts)
    if not buffers:
        return Evidence(False, facts, f"{call.name} declares no VMEM scratch")
    b = buffers[0]
    missing = ("never written" if not b["written"] else "never read back" if not b["read"]
               else "read, but what is read never reaches an output")
    return Evidence(False, facts, f"{call.name} declares VMEM scratch {b['dtype']}{b['shape']} but it is {missing}")


def _scalar_prefetch(call: PallasCallInfo, bench: bool) -> Evidence:
    body = [u.read and u.feeds_computation for u in call.prefetch_use]
    facts = {"kernel": call.name, "prefetched": call.num_scalar_prefetch,
             "index_maps_reading_them": call.prefetch_index_maps, "read_and_used_by_body": body}
    if call.num_scalar_prefetch and (call.prefetch_index_maps or any(body)):
        return Evidence(True, facts)
    if not call.num_scalar_prefetch:
        return Evidence(False, facts, f"{call.name} prefetches no scalars")
    return Evidence(False, facts, f"{call.name} prefetches {call.num_scalar_prefetch} operand(s) that "
                                  "no index map reads and the body never uses")


def _manual_dma(call: PallasCallInfo, bench: bool, large_bytes: float = 0.0) -> Evidence:
    """`large_bytes`: the bytes of the task's large inputs, which the DMAs must move half of
    at bench sizes (0: unknown, the call's own ANY operands only)."""
    prims = set(call.kernel_primitives)
    started = "dma_start" in prims and "dma_wait" in prims
    feeding = sum(u.read and u.reaches_output for u in call.dma_use)
    any_bytes = sum(int(np.prod(b.array_shape)) * np_dtype(b.dtype).itemsize
                    for b in call.blocks if b.memory_space in ("any", "hbm"))
    moved = call.dma_bytes_per_step * call.grid_steps * call.runs
    facts = {"kernel": call.name, "dma_started_and_waited": started,
             "dma_destinations": len(call.dma_use), "destinations_feeding_output": feeding}
    if not started:
        return Evidence(False, facts, f"{call.name} starts and waits no DMA")
    if not feeding:
        return Evidence(False, facts, f"{call.name}'s DMAs copy into {len(call.dma_use)} buffer(s) whose "
                                      "contents never reach an output (never read, or dropped before it)")
    if not bench:
        return Evidence(True, facts)
    facts.update(dma_bytes=moved, any_operand_bytes=any_bytes)
    if not any_bytes:
        return Evidence(False, facts, f"{call.name} leaves no operand outside the pipeline "
                                      "(memory space ANY) for its DMAs to move")
    if moved < MIN_DMA_SHARE * any_bytes:
        return Evidence(False, facts, f"{call.name}'s DMAs move {moved / any_bytes:.1%} of the "
                                      f"{any_bytes / 2**20:.1f} MiB of its ANY operands")
    if large_bytes:
        facts["large_input_bytes"] = large_bytes
        if moved < MIN_DMA_SHARE * large_bytes:
            return Evidence(False, facts, f"{call.name}'s DMAs move {moved / large_bytes:.1%} of the "
                                          f"{large_bytes / 2**20:.1f} MiB of the task's large inputs "
                                          "(the rest goes through the pipeline or another kernel)")
    return Evidence(True, facts)


def _parallel_grid(call: PallasCallInfo, bench: bool) -> Evidence:
    semantics = call.dimension_semantics or []
    parallel = [i for i, s in enumerate(semantics) if s in ("parallel", "core_parallel")]
    steps = {i: call.grid[i] if i < len(call.grid) else 1 for i in parallel}
    facts = {"kernel": call.name, "grid": call.grid, "parallel_axes": parallel}
    if not parallel:
        return Evidence(False, facts, f"{call.name} marks no grid axis parallel")
    if bench and not any(n > 1 for n in steps.values()):
        return Evidence(False, facts, f"{call.name}'s parallel axes {parallel} have one step each "
                                      f"(grid {call.grid})")
    return Evidence(True, facts)


def _input_output_aliases(call: PallasCallInfo, bench: bool, large_bytes: float = 0.0) -> Evidence:
    """`large_bytes`: the bytes of the task's large inputs, half of which the aliased inputs must
    hold at bench sizes (0: unknown, any alias counts)."""
    aliased = [call.blocks[i] for i, _ in call.aliases if 0 <= i < len(call.blocks)]
    aliased_bytes = sum(float(np.prod(b.array_shape)) * np_dtype(b.dtype).itemsize for b in aliased)
    facts = {"kernel": call.name, "aliased_inputs": [f"{b.dtype}{b.array_shape}" for b in aliased]}
    if not aliased:
        return Evidence(False, facts, f"{call.name} aliases no output to an input")
    if bench and large_bytes:
        facts.update(aliased_bytes=aliased_bytes, large_input_bytes=large_bytes)
        if aliased_bytes < MIN_DMA_SHARE * large_bytes:
            return Evidence(False, facts, f"{call.name} writes in place over {aliased_bytes / 2**20:.1f} MiB, "
                                          f"{aliased_bytes / large_bytes:.1%} of the {large_bytes / 2**20:.1f} MiB "
                                          "of the task's large inputs (the large ones are copied)")
    return Evidence(True, facts)


DETECTORS: dict[str, tuple[Callable[[PallasCallInfo, bool], Evidence], str]] = {
    "manual_dma": (_manual_dma, "leave the large operand in HBM (memory_space=pl.ANY) and copy the "
                                "parts each grid step needs into VMEM yourself (pltpu.make_async_copy(...)"
                                ".start() / .wait()), double-buffered"),
    "vmem_scratch": (_vmem_scratch, "allocate a VMEM scratch buffer (scratch_shapes=[pltpu.VMEM(...)]), "
                                    "accumulate into it across the grid steps and write it to the output "
                                    "at the last one"),
    "scalar_prefetch": (_scalar_prefetch, "prefetch the indices or lengths to SMEM with "
                                          "pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=...) and read them "
                                          "in the index maps (to choose blocks) or in the body (to bound loops, "
                                          "mask)"),
    "parallel_grid": (_parallel_grid, "split the work over a grid axis with more than one step and mark it "
                                      "\"parallel\" in pltpu.CompilerParams(dimension_semantics=...)"),
    "input_output_aliases": (_input_output_aliases, "update the large buffer in place: alias it to the output "
                                                    "(pl.pallas_call(..., input_output_aliases={input index: "
                                                    "output index}), counting scalar-prefetch operands) and "
                                                    "write only the blocks that change"),
}
# Detectors that also weigh the task's large inputs (bench sizes).
_WEIGH_LARGE_INPUTS = {"manual_dma": _manual_dma, "input_output_aliases": _input_output_aliases}


def feature_evidence(name: str, calls: list[PallasCallInfo], bench: bool) -> list[Evidence]:
    """Each kernel's evidence for one feature; the feature is used if any kernel uses it."""
    detector = DETECTORS[name][0]
    return [detector(call, bench) for call in calls]


def check_feature(name: str, calls: list[PallasCallInfo], bench: bool,
                  inputs: list[ArgSpec] | None = None) -> tuple[list[Evidence], str | None]:
    """Each kernel's evidence, and None if the kernels that use `name` carry at least
    MIN_WORK_SHARE of the case's work, else why not (a clause naming the kernels).
    `inputs`: the task's inputs at this case (for the large inputs of manual_dma and
    input_output_aliases)."""
    if name in _WEIGH_LARGE_INPUTS:
        large = _large_input_bytes([float(np.prod(a.shape)) * np_dtype(a.dtype).itemsize
                                    for a in inputs or []])
        evidence = [_WEIGH_LARGE_INPUTS[name](call, bench, large) for call in calls]
    else:
        evidence = feature_evidence(name, calls, bench)
    users = [i for i, e in enumerate(evidence) if e.used]
    if not users:
        return evidence, "; ".join(e.why_not for e in evidence) or "there is no kernel"
    weights, unit = work_weights(calls, bench)
    total = sum(weights)
    if not total:
        return evidence, None  # nothing to weigh: any use counts
    for i, e in enumerate(evidence):
        e.facts["work_share"] = round(weights[i] / total, 4)
    dominant = dominant_kernels(weights)
    if any(i in dominant for i in users):
        return evidence, None
    share = sum(weights[i] for i in users) / total
    heavy = ", ".join(f"{calls[i].name} ({weights[i] / total:.0%})" for i in dominant)
    return evidence, (f"only {', '.join(calls[i].name for i in users)} uses it, carrying {share:.1%} "
                      f"of the case's {unit}, and the kernels that carry most of it, {heavy}, do not "
                      f"({evidence[dominant[0]].why_not})")


def dominant_kernels(weights: list[float]) -> list[int]:
    """The heaviest kernels that together carry at least MIN_WORK_SHARE of the work, heaviest
    first (by index)."""
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    total, carried, chosen = sum(weights), 0.0, []
    for i in order:
        chosen.append(i)
        carried += weights[i]
        if carried >= MIN_WORK_SHARE * total:
            break
    return chosen


def work_weights(calls: list[PallasCallInfo], bench: bool) -> tuple[list[float], str]:
    """Each kernel's share-able work: its FLOPs where the traffic model counted them (bench
    sizes), else the bytes it moves (what the unit is called, for messages)."""
    flops = [call.flops for call in calls]
    if bench and sum(flops) > 0:
        return flops, "FLOPs"
    return [_moved_bytes(call) for call in calls], "bytes moved"


def _moved_bytes(call: PallasCallInfo) -> float:
    """Pipelined blocks: bytes per copy x copies (fetches where counted, else one per grid
    step); operands left in HBM: what the body's DMAs copy where counted, else their size."""
    total = 0.0
    for b in call.blocks:
        itemsize = np_dtype(b.dtype).itemsize
        if b.memory_space == "vmem":
            copies = b.fetches if b.fetches is not None else call.grid_steps
            total += float(np.prod(b.block_shape)) * itemsize * copies * call.runs
        elif b.memory_space not in ("any", "hbm"):  # SMEM operands: copied whole, once
            total += float(np.prod(b.array_shape)) * itemsize * call.runs
    dma = call.dma_bytes_per_step * call.grid_steps * call.runs
    if not dma:
        dma = sum(float(np.prod(b.array_shape)) * np_dtype(b.dtype).itemsize
                  for b in call.blocks if b.memory_space in ("any", "hbm")) * call.runs
    return total + dma


def _large_input_bytes(input_bytes: list[float]) -> float:
    """The bytes of the inputs that hold at least LARGE_OPERAND_SHARE of all inputs' bytes."""
    everything = sum(input_bytes)
    return float(sum(b for b in input_bytes if b >= LARGE_OPERAND_SHARE * everything))


def how_to_use(name: str) -> str:
    return DETECTORS[name][1]
