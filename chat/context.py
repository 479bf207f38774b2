"""Hardware context for the system prompt: the `--context none|spec|guide` ablation.

The ladder is cumulative so that each rung adds information and nothing else changes:
"none" adds nothing, "spec" adds a TPU spec sheet, "guide" adds the spec sheet followed by our
written guide to Pallas on TPU (chat/guide/pallas_tpu.md).

The per-generation numbers the evaluator also uses (VMEM, default scoped VMEM limit, HBM
bandwidth, peak bf16 FLOP/s) come from `evaluator.performance.hardware.GENERATIONS`, so the prompt and the
VMEM/performance checks can never disagree. Only facts that table lacks live here.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS, MiB, TpuGeneration

CONTEXTS = ("none", "spec", "guide")

GUIDE_PATH = Path(__file__).parent / "guide" / "pallas_tpu.md"

GiB = 1 << 30


@dataclass(frozen=True)
class ChipFacts:
    """What a kernel author needs beyond evaluator.performance.hardware: matmul unit size and core layout."""
    mxu: int                 # MXU is mxu x mxu (tpu_info.py: mxu_column_size)
    cores_per_device: int    # TensorCores behind one JAX device (2 = megacore)
    cores_per_chip: int      # physical TensorCores on the chip
    hbm_gib_per_chip: int    # HBM capacity of the whole chip


# Sources: Google Cloud TPU architecture pages (see SOURCES) and jax/_src/pallas/mosaic/tpu_info.py
# (jax 0.10.2). HBM capacity: Google's pages mix "GB" and "GiB" (v5e "16 GB", v6e "32 GB", the TPU7x
# page lists v5p 95 / v6e 32 / TPU7x 192 "GiB"); tpu_info.py's byte counts (17.2e9, 34.4e9, 103e9,
# 206e9) match GiB, so we write GiB.
CHIP_FACTS: dict[str, ChipFacts] = {
    "v4": ChipFacts(mxu=128, cores_per_device=2, cores_per_chip=2, hbm_gib_per_chip=32),
    "v5e": ChipFacts(mxu=128, cores_per_device=1, cores_per_chip=1, hbm_gib_per_chip=16),
    "v5p": ChipFacts(mxu=128, cores_per_device=2, cores_per_chip=2, hbm_gib_per_chip=95),
    "v6e": ChipFacts(mxu=256, cores_per_device=1, cores_per_chip=1, hbm_gib_per_chip=32),
    # A v7x chip has two TensorCores without megacore: each is its own JAX device.
    "v7x": ChipFacts(mxu=256, cores_per_device=1, cores_per_chip=2, hbm_gib_per_chip=192),
}

SOURCES = (
    "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm",
    "https://cloud.google.com/tpu/docs/v4",
    "https://cloud.google.com/tpu/docs/v5e",
    "https://cloud.google.com/tpu/docs/v5p",
    "https://cloud.google.com/tpu/docs/v6e",
    "https://cloud.google.com/tpu/docs/tpu7x",
    "https://github.com/jax-ml/jax/blob/main/jax/_src/pallas/mosaic/tpu_info.py",
)


def render_context(kind: str, generation: str = DEFAULT_GENERATION) -> str:
    """The hardware context for one rung of the ablation ladder, for a target generation.

    Both arguments are checked even for "none", so a typo fails at once rather than silently
    producing an ablation run without the context it was meant to have.
    """
    if kind not in CONTEXTS:
        raise ValueError(f"unknown context {kind!r}; choose one of: {', '.join(CONTEXTS)}")
    if generation not in GENERATIONS:
        raise ValueError(f"unknown TPU generation {generation!r}; choose one of: {', '.join(GENERATIONS)}")
    if kind == "none":
        return ""
    sheet = spec_sheet(generation)
    if kind == "spec":
        return sheet
    return f"{sheet}\n\n{guide_text()}"


def spec_sheet(generation: str = DEFAULT_GENERATION) -> str:
    """Markdown table of every generation, then the target generation's budget and sources.

    All generations are shown (not just the target) so the model can reason about what differs,
    e.g. why a block size that fits v6e's 32 MiB scoped VMEM fails on v5e.
    """
    rows = [
        "| Generation | device_kind | TensorCores per JAX device | MXU | VMEM per TensorCore | "
        "Default scoped VMEM limit | HBM per chip | HBM bandwidth per device | "
        "Peak bf16 per device | Ridge point |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, gen in GENERATIONS.items():
        facts = CHIP_FACTS[name]
        rows.append(
            f"| {name} | {gen.device_kind} | {_cores_text(facts)} | {facts.mxu}x{facts.mxu} | "
            f"{gen.vmem_bytes // MiB} MiB | {gen.default_scoped_vmem_bytes // MiB} MiB | "
            f"{facts.hbm_gib_per_chip} GiB | {gen.hbm_bytes_per_s / 1e9:,.0f} GB/s | "
            f"{gen.bf16_flops_per_s / 1e12:,.0f} TFLOP/s | {ridge_point(gen):.0f} FLOP/byte |")
    sources = "\n".join(f"- {url}" for url in SOURCES)
    return (
        "## TPU hardware\n\n"
        + "\n".join(rows)
        + "\n\n"
        + _target_sentence(generation)
        + "\n\nNotes: bandwidth and FLOP/s are per JAX device (a v4/v5p device is a whole megacore chip, "
        "a v7x device is one of its chip's two TensorCores). The ridge point is peak FLOP/s divided by "
        "HBM bandwidth: a kernel doing fewer FLOPs per HBM byte than that is memory-bound. "
        "On every generation the last two dims of a block must follow the (8, 128) tiling rule.\n\n"
        "Sources:\n" + sources
    )


def ridge_point(gen: TpuGeneration) -> float:
    """FLOP per HBM byte at which a kernel stops being memory-bound (roofline knee)."""
    return gen.bf16_flops_per_s / gen.hbm_bytes_per_s


@cache
def guide_text() -> str:
    """The written guide, shipped as package data next to this module."""
    return GUIDE_PATH.read_text(encoding="utf-8").strip()


def _cores_text(facts: ChipFacts) -> str:
    if facts.cores_per_device > 1:
        return f"{facts.cores_per_device} (megacore)"
    if facts.cores_per_chip > 1:
        return f"1 (chip has {facts.cores_per_chip})"
    return "1"


def _target_sentence(generation: str) -> str:
    gen, facts = GENERATIONS[generation], CHIP_FACTS[generation]
    scoped, physical = gen.default_scoped_vmem_bytes // MiB, gen.vmem_bytes // MiB
    if scoped < physical:
        raise_it = (f"raise it with `pltpu.CompilerParams(vmem_limit_bytes=...)` up to the {physical} MiB "
                    "physical VMEM per TensorCore")
    else:
        raise_it = f"that is all the {physical} MiB of physical VMEM per TensorCore, so it cannot be raised"
    sentence = (
        f"**Target: {gen.name}** ({gen.device_kind}). One kernel may use {scoped} MiB of VMEM by default "
        f"(the scoped limit); {raise_it}. Ridge point: {gen.bf16_flops_per_s / 1e12:,.0f} TFLOP/s / "
        f"{gen.hbm_bytes_per_s / 1e9:,.0f} GB/s = {ridge_point(gen):.0f} FLOP/byte. "
        f"MXU {facts.mxu}x{facts.mxu}: matmul block dims that are multiples of {facts.mxu} fill it.")
    if facts.cores_per_device > 1:
        sentence += (f" One device has {facts.cores_per_device} TensorCores: grid axes marked \"parallel\" "
                     "are split between them.")
    return sentence
