"""matmul_int8_scaled: int8 x[M, K] @ int8 w[K, N] with per-row / per-column dequant scales.

out = (x @ w computed exactly in int32) * sx[:, None] * sw[None, :], in the scale dtype.
The case dtype is the dtype of the scales and of the output (float32 or bfloat16); x and w
are always int8.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import DEFAULT_TOLERANCES, ArgSpec, Case, Task, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x, sx, w, sw):
    acc = jnp.dot(x, w, preferred_element_type=jnp.int32).astype(jnp.float32)
    return (acc * sx[:, None] * sw[None, :]).astype(sx.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), "int8"), ArgSpec((d["m"],), case.dtype),
            ArgSpec((d["k"], d["n"]), "int8"), ArgSpec((d["n"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Symmetric int8 x and w."""
    return [(-127, 127), None, (-127, 127), None]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    m, k, n = case.dims["m"], case.dims["k"], case.dims["n"]
    # Full-range int8 values (std ~73.6) and positive scales spread over [0.5, 1.5] / 127 per
    # row and per column (the column scale also carries 1/sqrt(K)): outputs are O(0.3), and a
    # kernel that drops either scale, or swaps rows for columns, is off by a wide margin.
    x = rng.integers(-127, 128, size=(m, k), dtype=np.int8)
    w = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
    sx = rng.uniform(0.5, 1.5, size=m) / 127.0
    sw = rng.uniform(0.5, 1.5, size=n) / (127.0 * np.sqrt(k))
    dt = np_dtype(case.dtype)
    return x, sx.astype(np.float32).astype(dt), w, sw.astype(np.float32).astype(dt)


CASES = (
    # The first spans two K tiles, so the int32 accumulator carries across grid steps.
    case_grid("train", "check", [dict(m=256, k=2048, n=256), dict(m=140, k=448, n=320)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim (m not a multiple of int8's
    # 32-row tile), a single row.
    + case_grid("heldout", "check", [dict(m=100, k=300, n=200), dict(m=1, k=768, n=136)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, k=5000, n=1000)], _DTYPES)
)

TASK = Task(
    name="matmul_int8_scaled",
    version=2,
    level=1,
    description=("int8 x int8 matmul accumulated exactly in int32, dequantised with per-row "
                 "scales sx and per-column scales sw; output in the scale dtype."),
    signature="kernel(x[M, K] int8, sx[M], w[K, N] int8, sw[N]) -> [M, N] (dtype of sx)",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("vmem_scratch",),
    # The case dtype is the scale/output dtype; the int8 data never names a case dtype.
    tolerances={"float32": DEFAULT_TOLERANCES["float32"],
                "bfloat16": DEFAULT_TOLERANCES["bfloat16"]},
)
