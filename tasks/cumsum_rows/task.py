"""cumsum_rows: inclusive cumulative sum along the last axis of x[rows, d], in float32.

Output in x.dtype. (lax.cumsum has no Pallas TPU lowering: kernels need another formulation,
e.g. a triangular matmul per block with a carried running sum.)
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x):
    return jnp.cumsum(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"], case.dims["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Steps N(0, 1) / sqrt(d) plus a per-row drift in [-1.5, 1.5] / d: each row is a random
    # walk ending O(1) from zero, so a missing carry between column blocks, an exclusive
    # scan or a reversed scan is far off.
    rows, d = case.dims["rows"], case.dims["d"]
    drift = rng.uniform(-1.5, 1.5, size=(rows, 1)).astype(np.float32) / d
    x = rng.standard_normal((rows, d), dtype=np.float32) * d ** -0.5 + drift
    return (x.astype(np_dtype(case.dtype)),)


CASES = (
    # Several column blocks (the running sum carries across grid steps); several row blocks.
    case_grid("train", "check", [dict(rows=256, d=1024), dict(rows=270, d=900)], _DTYPES)
    # Held-out shapes differ in kind: unaligned rows and columns with a ragged last row block
    # (600 rows, 700 columns), a few long rows (fewer than one sublane tile).
    + case_grid("heldout", "check", [dict(rows=600, d=700), dict(rows=3, d=2000)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(rows=2000, d=10000)], _DTYPES)
)

TASK = Task(
    name="cumsum_rows",
    version=2,
    level=1,
    description=("Inclusive cumulative sum along the last axis, computed in float32; output in "
                 "x.dtype."),
    signature="kernel(x[rows, d]) -> [rows, d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    heldout_task=True,
)
