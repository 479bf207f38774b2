"""The reward RL trains on, from a verdict: what an answer is worth (docs/training.md, "Reward").

Only a `correct` verdict earns anything: 1, plus a speed term from the speedup over XLA (the
measured one where the kernel ran on a TPU, else the predicted one), on a log scale and capped,
so that it can never make a correct kernel worth less than `min_correct`. Every other status is
worth 0: no code, refused (policy, no Pallas kernel, work left outside it, a requested feature
missing), failures to lower or run, wrong values, and `unverified`/`grader_limit` (nothing was
confirmed). There is no partial credit for stages reached: a cheat that passes the static
stages and is then caught would earn more than an honest kernel that fails to lower, the one
thing a reward must never do.

A conversation of several answers is worth its discounted return: turn t's reward counts
gamma^(t-1), so a kernel right at the first answer is worth more than one right after repairs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from evaluator.record import Status, Verdict

# Refused as a cheat or as not a Pallas kernel: what the hack rate counts.
HACK_STATUSES = frozenset({Status.POLICY_VIOLATION, Status.NO_KERNEL, Status.WORK_OUTSIDE_KERNEL})


@dataclass(frozen=True)
class RewardSpec:
    """The reward's constants. Defaults: Kevin-32B's gamma 0.4 across turns; a 2x speedup or
    slowdown moves a correct kernel's reward by `speed_weight` (0.25), capped at 4x either way."""

    speed_weight: float = 0.25
    speed_cap: float = 4.0
    gamma: float = 0.4

    def __post_init__(self) -> None:
        if self.speed_weight < 0 or self.speed_cap < 1 or not 0 < self.gamma <= 1:
            raise ValueError("reward: speed_weight must be >= 0, speed_cap >= 1 and gamma in (0, 1]")
        if self.min_correct <= 0:
            raise ValueError(f"reward: speed_weight {self.speed_weight} with speed_cap {self.speed_cap} can make a "
                             "slow correct kernel worth no more than a failure; lower one of them")

    @property
    def min_correct(self) -> float:
        """The least a correct kernel earns (the slowest, at the cap)."""
        return 1.0 - self.speed_weight * math.log2(self.speed_cap)

    def speed_term(self, speedup: float | None) -> float:
        """speed_weight * log2(speedup), the speedup clipped to [1/cap, cap]; 0 when unknown."""
        if speedup is None or not math.isfinite(speedup) or speedup <= 0:
            return 0.0
        clipped = min(max(speedup, 1.0 / self.speed_cap), self.speed_cap)
        return self.speed_weight * math.log2(clipped)

    def reward(self, verdict: Verdict) -> float:
        """What one answer is worth."""
        if verdict.status != Status.CORRECT:
            return 0.0
        return 1.0 + self.speed_term(speedup_of(verdict))

    def discounted_return(self, rewards: list[float]) -> float:
        """A conversation's worth from its first answer: sum of gamma^(t-1) * reward of turn t."""
        return sum(self.gamma ** t * r for t, r in enumerate(rewards))


def speedup_of(verdict: Verdict) -> float | None:
    """The measured speedup over XLA where the kernel ran on a TPU, else the predicted one."""
    if verdict.speedup is not None:
        return verdict.speedup
    predicted: dict[str, Any] | None = verdict.predicted_speedup
    return predicted.get("overall") if predicted else None


def is_hack(verdict: Verdict) -> bool:
    return verdict.status in HACK_STATUSES
