"""gelu_sum: y = sum(gelu_tanh(x), axis=-1) over x[rows, d] -> [rows], in float32.

gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (jax.nn.gelu with
approximate=True). Output in x.dtype.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x):
    g = jax.nn.gelu(x.astype(jnp.float32), approximate=True)
    return jnp.sum(g, axis=-1).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"], case.dims["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["rows"],), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # 1.5 * N(0, 1) plus a per-row offset in [-1.5, 0.5]: most values sit where gelu bends
    # (so relu, identity or a wrong constant in the formula miss), and row sums range from
    # about 0.1 d to 0.6 d, so a constant or a sum missing a column block fails.
    rows, d = case.dims["rows"], case.dims["d"]
    offsets = rng.uniform(-1.5, 0.5, size=(rows, 1)).astype(np.float32)
    x = rng.standard_normal((rows, d), dtype=np.float32) * 1.5 + offsets
    return (x.astype(np_dtype(case.dtype)),)


CASES = (
    # Several column blocks (the sum carries across grid steps); several row blocks.
    case_grid("train", "check", [dict(rows=128, d=3072), dict(rows=1030, d=320)], _DTYPES)
    # Held-out shapes differ in kind: ragged last row and column blocks (500 rows, 1900
    # columns), a few long rows (fewer than one sublane tile) with a ragged last column block.
    + case_grid("heldout", "check", [dict(rows=500, d=1900), dict(rows=6, d=2200)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(rows=6000, d=5000)], _DTYPES)
)

TASK = Task(
    name="gelu_sum",
    version=2,
    level=1,
    description=("Row sums of the tanh-approximated GELU, sum(gelu_tanh(x), -1), computed in "
                 "float32; output in x.dtype."),
    signature="kernel(x[rows, d]) -> [rows]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
)
