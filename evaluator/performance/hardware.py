"""TPU generations and the VMEM budget model used when no TPU compiler is at hand.

Physical VMEM, HBM bandwidth and peak bf16 FLOP/s are from jax's own table
(jax/_src/pallas/mosaic/tpu_info.py, jax 0.10.2), per JAX device: v4 and v5p devices are
megacore chips (two TensorCores), a v7x device is one of its chip's two TensorCores. The
default *scoped* VMEM limit is what Mosaic lets one kernel allocate unless it raises
`vmem_limit_bytes`: 16 MiB up to v5, 32 MiB on v6e and v7x (checked with libtpu 0.0.42.1:
a 22 MiB kernel fails for v5e with CompileTimeScopedVmemOom and compiles for v6e).

Two figures are assumptions, not published numbers (docs/performance-model.md):
GRID_STEP_S, the fixed cost of one Pallas grid step (~0.35 us, the figure jax's Pallas TPU
pipelining guide quotes), and F32_MATMUL_SHARE, the share of the bf16 peak a matmul on float32
operands reaches (we found no published per-generation figure: one third, a parameter).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evaluator.analysis.jaxpr_analysis import BlockInfo, PallasCallInfo
from tasks.spec import np_dtype

MiB = 1 << 20
GRID_STEP_S = 0.35e-6     # fixed cost of one grid step of a pallas_call (assumption)
F32_MATMUL_SHARE = 1 / 3  # f32-operand matmul throughput as a share of the bf16 peak (assumption)


@dataclass(frozen=True)
class TpuGeneration:
    name: str
    device_kind: str  # what jax.devices()[0].device_kind says on such a chip
    topology: str     # name for jax.experimental.topologies.get_topology_desc
    vmem_bytes: int
    default_scoped_vmem_bytes: int
    hbm_bytes_per_s: float
    bf16_flops_per_s: float

    @property
    def f32_matmul_flops_per_s(self) -> float:
        return self.bf16_flops_per_s * F32_MATMUL_SHARE


GENERATIONS: dict[str, TpuGeneration] = {
    g.name: g for g in (
        TpuGeneration("v4", "TPU v4", "v4:2x2x1", 16 * MiB, 16 * MiB, 1.23e12, 2.75e14),
        TpuGeneration("v5e", "TPU v5 lite", "v5e:2x2", 128 * MiB, 16 * MiB, 8.2e11, 1.97e14),
        TpuGeneration("v5p", "TPU v5", "v5p:2x2x1", 64 * MiB, 16 * MiB, 2.46e12, 4.59e14),
        TpuGeneration("v6e", "TPU v6 lite", "v6e:2x2", 128 * MiB, 32 * MiB, 1.64e12, 9.2e14),
        TpuGeneration("v7x", "TPU7x", "tpu7x:2x2x1", 64 * MiB, 32 * MiB, 3.7e12, 1.155e15),
    )
}
DEFAULT_GENERATION = "v5e"


def tiled_bytes(shape: list[int], dtype: str) -> int:
    """Bytes of a VMEM buffer after padding to Mosaic's tile: 128 lanes, and rows to the native
    tile's (8 for 32-bit types, 16 for bf16: 32-bit sublanes pack 16-bit rows in pairs) or, for
    fewer rows, to a power of two, at least one packed sublane's. libtpu's v5e compile
    allocated a (131072, 1, 128) f32 scratch at 64 MiB, (43690, 3, 128) at 85.33 MiB, and bf16
    (131072, 1, 128) at 64 MiB (docs/performance-model.md): one row is not padded to eight.

    Mosaic pads every buffer at least this much, so this never over-estimates.
    """
    itemsize = np_dtype(dtype).itemsize
    dims = list(shape) or [1]
    dims[-1] = _round_up(dims[-1], 128)
    if len(dims) >= 2:
        packed = max(1, 4 // itemsize)
        tile = 8 * packed
        rows = dims[-2]
        if rows >= tile:
            dims[-2] = _round_up(rows, tile)
        elif rows:
            dims[-2] = max(packed, 1 << (rows - 1).bit_length())
    return math.prod(dims) * itemsize


def vmem_lower_bound(call: PallasCallInfo) -> int:
    """VMEM the kernel needs for sure: pipelined blocks times their buffers, plus scratch.

    Values live inside the kernel body need more on top; we do not count them, so a kernel
    flagged over budget by this bound is over budget on the chip too. Lane-narrow blocks are
    not counted either (`lane_narrow`).
    """
    total = sum(buffers(call, block) * tiled_bytes(block.block_shape, block.dtype)
                for block in pipelined_blocks(call))
    for shape, dtype, space in call.scratch:
        if space == "vmem":
            total += tiled_bytes(shape, dtype)
    return total


def pipelined_blocks(call: PallasCallInfo) -> list[BlockInfo]:
    """The blocks the kernel's pipeline keeps in its scoped VMEM."""
    return [b for b in call.blocks if b.memory_space == "vmem" and not lane_narrow(b)]


def lane_narrow(block: BlockInfo) -> bool:
    """An operand under 128 lanes wide (its blocks are then as wide as it is).

    XLA often lays such an array out transposed in HBM and copies it whole into VMEM around the
    kernel rather than the kernel pipelining padded blocks of it: libtpu compiles for v5e a copy
    kernel whose (16384, 64) f32 blocks count 32 MiB padded, and JAXBench's level 2 18 (an
    (8192, 1) weights block) ran on a v5e. When it does, and whether the whole array then counts
    against the kernel's scoped limit (a (32768, 1) f32 output did, on a v5e), is XLA's choice,
    which we do not model: such blocks count nothing, and the bound stays a lower bound.
    """
    return bool(block.array_shape) and block.array_shape[-1] < 128


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
