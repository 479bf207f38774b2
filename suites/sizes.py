"""Check and held-out sizes derived from a peer suite's bench sizes.

Their sizes are bench sizes (lowered, compiled and timed on a TPU); interpret mode needs sizes
that run in seconds. A dimension is scaled down to a multiple of the largest power of two that
divides it, up to 2048 (JAXBench's tuned GEMM takes 1024 x 2048 blocks, its flash attention
2048-row blocks): a tuned kernel still tiles the check sizes. Where that is still too large
for interpret mode (attention over 4 x 64 heads x 2048 positions), the counts (heads, a small
batch) are divided first, since no tuned block spans them: 1 x 16 heads x 2048 positions. Only
where counts of 1 do not fit either is the power of two capped lower, and the task says so:
blocks larger than the cap no longer divide.

Held-out sizes differ in kind: batch 1, and one dimension made ragged (not a multiple of the
blocks a kernel tuned for the check sizes would take).
"""
from __future__ import annotations

import math
import re

from suites.source import MIN_SIZE

MAX_BLOCK = 2048
# Caps tried in turn until a case fits the budgets below.
CAPS = (2048, 1024, 512, 256, 128, 64, 32, 16)
MAX_CHECK_ELEMENTS = 24 * 2**20  # arguments + outputs of one check case
MAX_CHECK_FLOPS = 4e10           # the reference's work at one check case
BATCH_NAMES = ("batch", "batch_size", "b", "bs", "n_batch", "num_batch")


# Integer settings that are not sizes, whatever their value (rope_theta = 10000, a seed).
NOT_A_SIZE = re.compile(r"theta|eps|seed|base|scale|factor|value|prob|dropout", re.I)


def power_of_two_floor(value: int) -> int:
    """The largest power of two dividing `value`, at most MAX_BLOCK."""
    return min(value & -value, MAX_BLOCK)


def scaled(value: int, cap: int) -> int:
    """A bench size scaled to a check size: its power-of-two floor, at most `cap`. Sizes below
    MIN_SIZE are counts, not extents, and stay. An irregular size (no power of two of at least
    MIN_SIZE divides it: KernelBench's 8205) has no tiling to keep: it keeps its remainder
    modulo the cap instead, so it stays irregular (8205 -> 2048 + 13)."""
    if value < MIN_SIZE:
        return value
    if power_of_two_floor(value) < MIN_SIZE:
        return cap + value % cap if value >= 2 * cap else value
    return min(power_of_two_floor(value), cap)


def scale_all(sizes: dict[str, int], cap: int) -> dict[str, int]:
    return {k: v if NOT_A_SIZE.search(k) else scaled(v, cap) for k, v in sizes.items()}


# Sizes that count independent copies of the work (heads, sequences, a small batch): a tuned
# kernel's blocks do not span them, so they shrink before the extents a block must divide. A
# batch of MIN_SIZE or more is an extent too (KernelBench's GEMMs call their M `batch_size`).
HEADS = re.compile(r"heads|seqs", re.I)


def count_names(original: dict[str, int], by_value: bool) -> list[str]:
    """The count sizes that may shrink. In a file rewritten by value (`by_value`), only a count
    whose value no other size shares."""
    names = _unique(original) if by_value else list(original)
    return [k for k in names if original[k] > 1
            and (HEADS.search(k) or (is_batch(k) and original[k] < MIN_SIZE))]


def divide_counts(dims: dict[str, int], counts: list[str], factor: int) -> dict[str, int]:
    """`dims` with each count divided by as much of `factor` (a power of two) as divides it,
    so counts keep their ratios (query heads per kv head) until the smaller reaches 1."""
    return {**dims, **{k: dims[k] // math.gcd(dims[k], factor) for k in counts}}


def largest_count_factor(dims: dict[str, int], counts: list[str]) -> int:
    """The factor that takes every count to 1 where powers of two allow."""
    return max((power_of_two_floor(dims[k]) for k in counts), default=1)


def is_batch(name: str) -> bool:
    return name.lower() in BATCH_NAMES


def ragged(value: int) -> int:
    """A size a quarter larger, off every power-of-two block above 8: 64 -> 88, 2048 -> 2568."""
    return value + value // 4 + 8


def _unique(original: dict[str, int]) -> list[str]:
    """Sizes whose original value no other size shares: only those may change alone, so that
    a file that hard-codes its shapes maps each literal to one new value."""
    values = list(original.values())
    return [k for k in original if values.count(original[k]) == 1]


def batch_one(sizes: dict[str, int], original: dict[str, int]) -> dict[str, int]:
    """`sizes` with every batch dimension set to 1."""
    return {**sizes, **{k: 1 for k in _unique(original) if is_batch(k)}}


def heldout_variants(check: dict[str, int], original: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """Held-out size candidates, most different first: batch 1 and one ragged dimension, then
    each alone."""
    unique = _unique(original)
    batch = {k: v for k, v in batch_one(check, original).items() if v != check[k]}
    candidates = [k for k in unique if not is_batch(k) and not NOT_A_SIZE.search(k) and check[k] >= MIN_SIZE]
    rag = {}
    if candidates:
        k = max(candidates, key=lambda name: check[name])
        rag = {k: ragged(check[k])}
    variants: list[tuple[str, dict[str, int]]] = []
    for label, change in (("batch 1, ragged", {**batch, **rag}), ("batch 1", batch), ("ragged", rag)):
        dims = {**check, **change}
        if change and all(dims != seen for _, seen in variants):
            variants.append((label, dims))
    return variants
