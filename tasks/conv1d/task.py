"""conv1d: x[B, L, Cin] * w[K, Cin, Cout], stride 1, no padding ("VALID") -> [B, L-K+1, Cout]."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, w):
    out = jax.lax.conv_general_dilated(x, w, window_strides=(1,), padding="VALID",
                                       dimension_numbers=("NWC", "WIO", "NWC"),
                                       preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["l"], d["cin"]), case.dtype),
            ArgSpec((d["k"], d["cin"], d["cout"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["l"] - d["k"] + 1, d["cout"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec = arg_specs(case)
    fan_in = case.dims["k"] * case.dims["cin"]  # so outputs are O(1)
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=fan_in ** -0.5))


CASES = (
    case_grid("train", "check", [dict(b=2, l=128, cin=128, cout=128, k=3),
                                 dict(b=2, l=180, cin=96, cout=160, k=4)], _DTYPES)
    # Held-out: unaligned channels and length, batch 1, a wider filter.
    + case_grid("heldout", "check", [dict(b=1, l=100, cin=72, cout=200, k=7),
                                     dict(b=3, l=61, cin=130, cout=64, k=2)], _DTYPES)
    + case_grid("train", "bench", [dict(b=8, l=4096, cin=512, cout=512, k=3)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=4, l=3000, cin=300, cout=700, k=9)], _DTYPES)
)

TASK = Task(
    name="conv1d",
    version=2,
    level=1,
    description="1-D convolution (stride 1, VALID padding, NWC layout) written as matmuls over taps.",
    signature="kernel(x[B, L, Cin], w[K, Cin, Cout]) -> [B, L-K+1, Cout]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
)
