"""Input regimes of real data that several tasks share (tasks.spec.Stress).

Each wraps a task's own input maker and moves some of its inputs into the regime, so the rest
of the inputs (weights, scales, lengths) stay as the task draws them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tasks.spec import Case, Stress

InputMaker = Callable[[Case, np.random.Generator], tuple[np.ndarray, ...]]


def large_offset(make_inputs: InputMaker, which: int = 0) -> Stress:
    """Input `which` with every row moved far from zero, as activations drift after many
    residual adds: by 300-1000 in float32, where E[x^2] - E[x]^2 keeps few of its digits, and
    by 30-100 in bfloat16, whose 8 bits would round a larger offset's spread away."""
    def make(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        inputs = list(make_inputs(case, rng))
        x = inputs[which]
        rows = x.shape[:-1] + (1,)
        low = 300.0 if case.dtype == "float32" else 30.0
        offset = rng.uniform(low, low * 10 / 3, size=rows) * rng.choice([-1.0, 1.0], size=rows)
        inputs[which] = (x.astype(np.float32) + offset.astype(np.float32)).astype(x.dtype)
        return tuple(inputs)

    return Stress("large_offset", "rows whose mean is hundreds of times their spread", make)


def small_scale(make_inputs: InputMaker, which: tuple[int, ...] = (0,)) -> Stress:
    """Inputs `which` with each row scaled down 100 to 10,000 times (the same factor for all of
    them), so the norm's eps is a large part of the mean square: an eps outside the square root,
    or another eps, is off by far there and invisible on rows of magnitude 1."""
    def make(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        inputs = list(make_inputs(case, rng))
        rows = inputs[which[0]].shape[:-1] + (1,)
        factor = np.exp(rng.uniform(np.log(1e-4), np.log(1e-2), size=rows)).astype(np.float32)
        for i in which:
            inputs[i] = (inputs[i].astype(np.float32) * factor).astype(inputs[i].dtype)
        return tuple(inputs)

    return Stress("small_scale", "rows of magnitude 1e-4 to 1e-2, where eps is a large part of the mean square",
                  make)


def logit_offset(q: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """q and k whose attention logits q.k / sqrt(head_dim) all carry a per-query offset of 80 to
    120 (softmax does not change with it; models without QK-norm reach such logits): feature 0
    of every key is 1, feature 0 of each query its offset times sqrt(head_dim). Without its
    running max taken out, exp overflows float32 there."""
    d = q.shape[-1]
    q, k = q.astype(np.float32), k.astype(np.float32)
    q[..., 0] = rng.uniform(80.0, 120.0, size=q.shape[:-1]) * np.sqrt(d)
    k[..., 0] = 1.0
    return q, k


LARGE_LOGITS = "logits of 80 to 120 in every row, as models without QK-norm reach"
