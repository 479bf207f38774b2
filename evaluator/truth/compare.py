"""Stage 7's judgement: does an output match the reference within the task's tolerance?"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluator.truth.stress import SENSITIVITY_MULTIPLE
from tasks.spec import Tolerance


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    rel_l2_err: float
    mismatch_fraction: float
    worst_index: list[int]
    nonfinite: int
    reason: str  # empty when ok
    # The largest error relative to its bound, element-wise or L2 (1.0 = at the tolerance):
    # how close an honest kernel comes to failing (benchmarks/seed_stability.py).
    bound_ratio: float = 0.0


# Each element may also be off by this multiple of what TPU rounding of the reference's own dots
# moves it (`tpu_ref`). An honest kernel's element error is set by the magnitudes inside the
# computation, a dot before a relu, not by the output's scale: relu(1.5 * (x @ W + b - 2)) has
# a mostly-zero output (a small rms) while its nonzero elements carry the dot's full rounding.
# A kernel that rounds its dots as the TPU does lands within about 1x of that difference; 2x
# leaves room for rounding at other points (a scale folded into W before the dot).
TPU_ROUNDING_MULTIPLE = 2.0


def compare(out: np.ndarray, ref: np.ndarray, tol: Tolerance, tpu_ref: np.ndarray | None = None,
            sensitivity: np.ndarray | None = None) -> Comparison:
    """Element-wise bound plus a relative-L2 bound, in float64 (see tasks.spec.Tolerance).
    `tpu_ref`, the reference with its dots rounded as a TPU rounds them, widens each element's
    bound by TPU_ROUNDING_MULTIPLE times its distance from `ref`; the L2 bound stays as it is.
    `sensitivity` (stress cases: how far one float32 ulp of every input moves each element,
    evaluator/truth/stress.py) widens each element's bound, and the L2 bound, by
    SENSITIVITY_MULTIPLE times that movement.

    Coverage cases reach millions of elements, and the last case's comparison is on a
    grading's critical path: each float64 pass is made once, in place where it can be, and the
    masks that set non-finite values aside are only built when there are any: 1.7x faster on
    a 2560 x 2560 output, every metric the same."""
    out64 = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    err = np.abs(out64 - ref64)  # numpy reuses the temporary: one array, not two
    finite = _all_finite(err)  # then out and ref are finite too
    nonfinite = 0 if finite else int(np.count_nonzero(~np.isfinite(out64)))
    abs_ref = np.abs(ref64)
    scale = float(np.sqrt(np.mean(ref64 ** 2))) if ref64.size else 0.0
    allowed = tol.rtol * abs_ref
    allowed += tol.atol * scale
    if tpu_ref is not None:
        rounding = np.abs(np.asarray(tpu_ref, dtype=np.float64) - ref64)
        if not _all_finite(rounding):
            rounding = np.where(np.isfinite(rounding), rounding, 0.0)
        rounding *= TPU_ROUNDING_MULTIPLE
        allowed += rounding
    ref_norm = float(np.linalg.norm(ref64))
    rel_l2_bound = tol.rel_l2
    if sensitivity is not None:
        moved = np.where(np.isfinite(sensitivity), sensitivity, 0.0) * SENSITIVITY_MULTIPLE
        allowed += moved
        rel_l2_bound += float(np.linalg.norm(moved)) / ref_norm if ref_norm > 0 else 0.0
    bad = ~(err <= allowed)  # NaN compares False, so NaN outputs count as bad
    finite_err = err if finite else np.where(np.isfinite(err), err, 0.0)
    err_norm = float(np.linalg.norm(finite_err))
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else err_norm
    if nonfinite:
        rel_l2 = float("inf")
    excess = err - allowed if finite else np.where(np.isfinite(err), err - allowed, np.inf)
    worst = list(np.unravel_index(int(np.argmax(excess)), err.shape)) if err.size else []
    max_abs = float(finite_err.max()) if err.size else 0.0  # non-finite errors count as 0
    rel = err / np.maximum(abs_ref, 1e-30)
    max_rel = _finite_max(rel)
    mismatch = float(np.mean(bad)) if bad.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        if err.size and allowed.min() > 0:
            element_ratio = float(np.max(err / allowed))
        else:
            element_ratio = float(np.max(np.where(allowed > 0, err / allowed, np.where(err > 0, np.inf, 0.0)))) \
                if err.size else 0.0
    l2_ratio = rel_l2 / rel_l2_bound if rel_l2_bound > 0 else (0.0 if rel_l2 == 0 else float("inf"))
    bound_ratio = max(element_ratio, l2_ratio)
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} non-finite values (NaN/inf)")
    if mismatch > 0:
        n_bad = int(np.count_nonzero(bad))
        reasons.append(f"{n_bad} of {bad.size} elements outside tolerance"
                       if mismatch < 0.001 else f"{mismatch:.1%} of elements outside tolerance")
    if rel_l2 > rel_l2_bound:
        reasons.append(f"relative L2 error {rel_l2:.3g} > {rel_l2_bound:.3g}")
    return Comparison(ok=not reasons, max_abs_err=max_abs, max_rel_err=max_rel, rel_l2_err=rel_l2,
                      mismatch_fraction=mismatch, worst_index=[int(i) for i in worst],
                      nonfinite=nonfinite, reason="; ".join(reasons),
                      bound_ratio=bound_ratio if np.isfinite(bound_ratio) else float("inf"))


def _all_finite(a: np.ndarray) -> bool:
    """One pass: a sum is finite only when every term is (and does not overflow: float64
    holding float32 values cannot)."""
    return bool(np.isfinite(a.sum())) or bool(np.isfinite(a).all())


def _finite_max(a: np.ndarray) -> float:
    """The largest finite element (0.0 when there is none)."""
    if a.size:
        top = a.max()
        if np.isfinite(top):
            return float(top)  # NaN would have won, and inf is not finite
    finite = a[np.isfinite(a)]
    return float(finite.max()) if finite.size else 0.0
