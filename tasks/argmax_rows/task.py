"""argmax_rows: index of the largest element of each row of x[rows, d], as int32 [rows].

Ties resolve to the first index (as jnp.argmax), but the inputs are made tie-free: every
row's maximum is unique in its dtype. Outputs are compared exactly.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, Tolerance, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")
_EXACT = Tolerance(atol=0.0, rtol=0.0, rel_l2=0.0)


def reference(x):
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"], case.dims["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"],), "int32")]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    rows, d = case.dims["rows"], case.dims["d"]
    dt = np_dtype(case.dtype)
    # N(0, 1) rows with a per-row offset (some rows entirely negative, so a running max seeded
    # with 0 fails). bf16 has 8 mantissa bits, so a row's maximum often repeats: all but one
    # random copy of a repeated maximum are lowered by ~3% (well over one bf16 step), which
    # keeps the maximum unique without moving it to a predictable column.
    offsets = rng.uniform(-6.0, 1.0, size=(rows, 1)).astype(np.float32)
    x = (rng.standard_normal((rows, d), dtype=np.float32) + offsets).astype(dt).astype(np.float32)
    top = x.max(axis=1, keepdims=True)
    tied = x == top
    keep = np.argmax(np.where(tied, rng.random((rows, d)), -1.0), axis=1)[:, None]
    lower = tied & (np.arange(d)[None, :] != keep)
    x = np.where(lower, top - (np.abs(top) + 1.0) / 32.0, x).astype(dt)
    check = x.astype(np.float32)
    assert ((check == check.max(axis=1, keepdims=True)).sum(axis=1) == 1).all()
    return (x,)


def tied_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Rows of small integers (0 to 7, minus a per-row offset of 0 to 6), exact in either dtype:
    each row's maximum repeats at many columns, across column blocks, and the argmax is the
    first of them (jnp.argmax's rule), which a comparison that keeps the later of equal values,
    or a merge of blocks that prefers the later block, does not return. The task's own inputs
    keep every maximum unique."""
    rows, d = case.dims["rows"], case.dims["d"]
    x = rng.integers(0, 8, size=(rows, d)) - rng.integers(0, 7, size=(rows, 1))
    return (x.astype(np.float32).astype(np_dtype(case.dtype)),)


CASES = (
    # Several column blocks (the running best carries across grid steps); several row blocks.
    case_grid("train", "check", [dict(rows=512, d=2048), dict(rows=530, d=960)], _DTYPES)
    # Held-out shapes differ in kind: ragged last row and column blocks (600 rows, 1300
    # columns), a few long rows (fewer than one sublane tile) with a ragged last column block.
    + case_grid("heldout", "check", [dict(rows=600, d=1300), dict(rows=3, d=3000)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(rows=4000, d=7000)], _DTYPES)
)

TASK = Task(
    name="argmax_rows",
    version=2,
    level=1,
    description=("Row-wise argmax over the last axis (first index of the maximum) as int32; "
                 "compared exactly."),
    signature="kernel(x[rows, d]) -> [rows] int32",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    # Indices are exact: any wrong row is a wrong answer.
    tolerances={"float32": _EXACT, "bfloat16": _EXACT},
    stresses=(Stress("ties", "rows whose maximum repeats at many columns", tied_inputs),),
)
