"""Benchmark metrics as small pure functions: pass@k (unbiased), fast_p, status shares."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct.

    The unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k); needs k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got {n=} {c=}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got {n=} {k=}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def fast_p(statuses: Sequence[str], speedups: Sequence[float | None], p: float) -> float | None:
    """Share of samples that are correct and faster than the XLA reference by more than p.

    None when no sample was timed (no hardware): "not measured" is not "0% fast".
    """
    if not any(s is not None for s in speedups):
        return None
    hits = sum(1 for st, sp in zip(statuses, speedups) if st == "correct" and sp is not None and sp > p)
    return hits / len(statuses)


def status_shares(statuses: Sequence[str]) -> dict[str, float]:
    counts = Counter(statuses)
    return {status: n / len(statuses) for status, n in counts.most_common()}
