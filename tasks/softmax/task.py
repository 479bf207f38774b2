"""softmax: softmax of x[..., d] over the last axis, same shape and dtype, computed in float32."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, activation_shape, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec(activation_shape(case), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Scale 3 makes rows peaky (the largest probability is far above 1/d), so uniform,
    # zero or constant outputs miss the reference by a wide margin. A per-row offset of
    # 90-110 makes exp overflow in float32 in every row unless the kernel subtracts the
    # row max (softmax itself does not change with the offset).
    shape = activation_shape(case)
    logits = rng.standard_normal(shape, dtype=np.float32) * 3.0
    offsets = rng.uniform(90.0, 110.0, size=shape[:-1] + (1,)).astype(np.float32)
    return ((logits + offsets).astype(np_dtype(case.dtype)),)


def negative_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The task's logits moved down by 200: every row far below zero, so a running max seeded
    with 0 (rather than -inf or the first value) is 0, and exp(x - 0) underflows to 0 in every
    column (softmax itself does not change)."""
    (x,) = make_inputs(case, rng)
    return ((x.astype(np.float32) - 200.0).astype(x.dtype),)


CASES = (
    # 2-D [rows, d] and 3-D [b, s, d]; the first spans several row blocks.
    case_grid("train", "check", [dict(rows=1024, d=256), dict(rows=1100, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d and row counts, a ragged last row block,
    # a single row.
    + case_grid("heldout", "check",
                [dict(rows=37, d=1000), dict(b=3, s=300, d=200), dict(b=1, s=1, d=640)], _DTYPES)
    + case_grid("train", "bench", [dict(rows=8192, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=4, s=2000, d=5000)], _DTYPES)
)

TASK = Task(
    name="softmax",
    version=2,
    level=1,
    description="Softmax over the last axis, computed in float32; output in the input dtype.",
    signature="kernel(x[..., d]) -> [..., d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    stresses=(Stress("negative_logits", "rows of logits around -100, every value below zero", negative_inputs),),
)
