"""reduce_sum_max: row-wise sum and max of x[rows, d], returned as a tuple (sum, max).

Both outputs are [rows] in x.dtype; the sum is accumulated in float32.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x):
    xf = x.astype(jnp.float32)
    return (jnp.sum(xf, axis=-1).astype(x.dtype), jnp.max(xf, axis=-1).astype(x.dtype))


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"], case.dims["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"],), case.dtype)] * 2


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # N(0, 1) plus a per-row offset in [-1, 1]: row sums spread over about +-d, row maxima
    # over about 2-5, so a constant, a swapped pair of outputs or a sum that misses a column
    # block all fail; negative rows make a max seeded with 0 wrong.
    rows, d = case.dims["rows"], case.dims["d"]
    offsets = rng.uniform(-1.0, 1.0, size=(rows, 1)).astype(np.float32)
    x = rng.standard_normal((rows, d), dtype=np.float32) + offsets
    return (x.astype(np_dtype(case.dtype)),)


def negative_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The task's rows moved down by 10: every value negative, so a max seeded with 0 returns 0
    (with the task's own inputs some value of every long row is positive)."""
    (x,) = make_inputs(case, rng)
    return ((x.astype(np.float32) - 10.0).astype(x.dtype),)


CASES = (
    # Several column blocks (the reduction carries across grid steps); several row blocks.
    case_grid("train", "check", [dict(rows=256, d=2048), dict(rows=1030, d=576)], _DTYPES)
    # Held-out shapes differ in kind: ragged last row and column blocks (700 rows, 1100
    # columns), a few long rows (fewer than one sublane tile) whose last column block is ragged.
    + case_grid("heldout", "check", [dict(rows=700, d=1100), dict(rows=5, d=2500)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(rows=5000, d=6000)], _DTYPES)
)

TASK = Task(
    name="reduce_sum_max",
    version=2,
    level=1,
    description=("Row-wise sum (float32 accumulation) and row-wise max of a matrix, returned "
                 "together as two outputs in x.dtype."),
    signature="kernel(x[rows, d]) -> (sum[rows], max[rows])",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(Stress("negative_rows", "rows whose every value is below zero", negative_inputs),),
)
