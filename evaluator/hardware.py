"""TPU generations and the VMEM budget model used when no TPU compiler is at hand.

Physical VMEM per TensorCore is from jax's own table (jax/_src/pallas/mosaic/tpu_info.py,
jax 0.10.2). The default *scoped* limit is what Mosaic lets one kernel allocate unless it
raises `vmem_limit_bytes` (16 MiB up to v5, 32 MiB on v6e and v7x, per the Pallas TPU docs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evaluator.jaxpr_analysis import BlockInfo, PallasCallInfo

MiB = 1 << 20


@dataclass(frozen=True)
class TpuGeneration:
    name: str
    device_kind: str  # what jax.devices()[0].device_kind says on such a chip
    vmem_bytes: int
    default_scoped_vmem_bytes: int


GENERATIONS: dict[str, TpuGeneration] = {
    g.name: g for g in (
        TpuGeneration("v4", "TPU v4", 16 * MiB, 16 * MiB),
        TpuGeneration("v5e", "TPU v5 lite", 128 * MiB, 16 * MiB),
        TpuGeneration("v5p", "TPU v5", 64 * MiB, 16 * MiB),
        TpuGeneration("v6e", "TPU v6 lite", 128 * MiB, 32 * MiB),
        TpuGeneration("v7x", "TPU7x", 64 * MiB, 32 * MiB),
    )
}
DEFAULT_GENERATION = "v5e"

_ITEMSIZE = {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
             "float64": 8, "int64": 8}


def tiled_bytes(shape: list[int], dtype: str) -> int:
    """Bytes of a VMEM buffer after padding to the native (sublane, 128-lane) tile.

    Mosaic pads every buffer at least this much, so this never over-estimates.
    """
    itemsize = _ITEMSIZE.get(dtype, 4)
    dims = list(shape) or [1]
    dims[-1] = _round_up(dims[-1], 128)
    if len(dims) >= 2:
        dims[-2] = _round_up(dims[-2], 8 * max(1, 4 // itemsize))  # bf16 packs 16 rows
    return math.prod(dims) * itemsize


def vmem_lower_bound(call: PallasCallInfo) -> int:
    """VMEM the kernel needs for sure: pipelined blocks times their buffers, plus scratch.

    Values live inside the kernel body need more on top; we do not count them, so a kernel
    flagged over budget by this bound is over budget on the chip too.
    """
    total = 0
    for block in call.blocks:
        if block.memory_space == "vmem":
            total += buffers(call, block) * tiled_bytes(block.block_shape, block.dtype)
    for shape, dtype, space in call.scratch:
        if space == "vmem":
            total += tiled_bytes(shape, dtype)
    return total


def buffers(call: PallasCallInfo, block: BlockInfo) -> int:
    """VMEM buffers the pipeline gives a block: a single-step grid is not pipelined, and
    libtpu then allocates one ("This allocation is single buffered" for grid-less kernels)."""
    return 1 if all(g == 1 for g in call.grid) else block.buffer_count


def vmem_budget(call: PallasCallInfo, generation: TpuGeneration) -> tuple[int, str]:
    """(limit in bytes, where the limit comes from)."""
    if call.vmem_limit_bytes:
        limit = min(int(call.vmem_limit_bytes), generation.vmem_bytes)
        return limit, f"vmem_limit_bytes={call.vmem_limit_bytes} (physical {generation.vmem_bytes // MiB} MiB)"
    return generation.default_scoped_vmem_bytes, (
        f"the default scoped VMEM limit of {generation.default_scoped_vmem_bytes // MiB} MiB on {generation.name}")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
