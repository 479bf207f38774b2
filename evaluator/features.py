"""Stage 5: is each TPU feature a task requires really used by one of its kernels?

Each detector reads the PallasCallInfo that the worker extracted from the jaxpr.
"""
from __future__ import annotations

from typing import Callable

from evaluator.jaxpr_analysis import PallasCallInfo


def _manual_dma(call: PallasCallInfo) -> bool:
    prims = set(call.kernel_primitives)
    return "dma_start" in prims and "dma_wait" in prims


def _vmem_scratch(call: PallasCallInfo) -> bool:
    return any(space == "vmem" for _, _, space in call.scratch)


def _scalar_prefetch(call: PallasCallInfo) -> bool:
    return call.num_scalar_prefetch > 0


def _parallel_grid(call: PallasCallInfo) -> bool:
    return any(s in ("parallel", "core_parallel") for s in (call.dimension_semantics or []))


DETECTORS: dict[str, tuple[Callable[[PallasCallInfo], bool], str]] = {
    "manual_dma": (_manual_dma, "start and wait async copies inside the kernel "
                                "(pltpu.make_async_copy(...).start() / .wait())"),
    "vmem_scratch": (_vmem_scratch, "allocate a VMEM scratch buffer (scratch_shapes=[pltpu.VMEM(...)])"),
    "scalar_prefetch": (_scalar_prefetch, "prefetch scalars to SMEM with "
                                          "pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=...)"),
    "parallel_grid": (_parallel_grid, "mark a grid axis \"parallel\" in "
                                      "pltpu.CompilerParams(dimension_semantics=...)"),
}


def missing_features(required: tuple[str, ...], calls: list[PallasCallInfo]) -> list[str]:
    return [name for name in required if not any(DETECTORS[name][0](c) for c in calls)]


def how_to_use(name: str) -> str:
    return DETECTORS[name][1]
