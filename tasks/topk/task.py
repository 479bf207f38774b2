"""topk: the 8 largest values of each row of x[..., d], in descending order (lax.top_k)."""
from pathlib import Path

import jax
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, activation_shape, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")
K = 8  # fixed: a bounded selection, as in MoE routing and sampling


def reference(x):
    return jax.lax.top_k(x, K)[0].astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case)[:-1] + (K,), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Heavy-tailed values (signed log-normal) so the top 8 of a row differ by large factors,
    # plus a per-row offset: returning the row max 8 times, the first 8 values, or the top 8
    # of another row all fail.
    (spec,) = arg_specs(case)
    magnitude = np.exp(rng.standard_normal(spec.shape))
    sign = np.where(rng.random(spec.shape) < 0.5, -1.0, 1.0)
    offset = rng.uniform(-2.0, 2.0, size=spec.shape[:-1] + (1,))
    return ((sign * magnitude + offset).astype(np.float32).astype(np_dtype(case.dtype)),)


def tied_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Rows of half-integers from -4 to 4 (exact in either dtype): the largest values repeat, and
    the top 8 hold each as many times as the row does. A selection that masks every copy of the
    value it took (x == best) instead of one position loses the repeats."""
    (spec,) = arg_specs(case)
    return ((rng.integers(-8, 9, size=spec.shape) / 2.0).astype(np.float32).astype(np_dtype(case.dtype)),)


CASES = (
    case_grid("train", "check", [dict(rows=256, d=1024), dict(b=3, s=20, d=700)], _DTYPES)
    # Held-out: unaligned row counts and widths, a single row, a wide row.
    + case_grid("heldout", "check", [dict(rows=37, d=1000), dict(b=1, s=1, d=3000)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=4, s=2000, d=5000)], _DTYPES)
)

TASK = Task(
    name="topk",
    version=2,
    level=1,
    description="The 8 largest values of each row, descending (a bounded selection; no sort on TPU).",
    signature="kernel(x[..., d]) -> [..., 8]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(Stress("ties", "rows whose largest values repeat", tied_inputs),),
)
