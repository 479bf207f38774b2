"""dequant_matmul: x[M, K] @ (wq[K, N] int8 * scales[N] f32) -> [M, N] in x.dtype."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import MXU_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype

_DTYPES = ("float32", "bfloat16")
_INT8_STD = 127 / np.sqrt(3)  # std of integers uniform on [-127, 127]


def reference(x, wq, scales):
    w = wq.astype(jnp.float32) * scales.astype(jnp.float32)[None, :]
    return jnp.dot(x.astype(jnp.float32), w, precision=lax.Precision.HIGHEST).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), "int8"),
            ArgSpec((d["n"],), "float32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Symmetric int8 weights."""
    return [None, (-127, 127), None]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec, s_spec = arg_specs(case)
    k = case.dims["k"]
    # Symmetric int8 weights over the full range; per-column scales spread by 3x and sized so
    # the dequantised weights have std ~1/sqrt(K), making the output O(1).
    wq = rng.integers(-127, 128, size=w_spec.shape).astype(np.int8)
    scales = (rng.uniform(0.5, 1.5, size=s_spec.shape) / (_INT8_STD * np.sqrt(k)))
    return normal(rng, x_spec.shape, case.dtype), wq, scales.astype(np.float32)


def outlier_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x with a few features (one in 128) 50 to 100 times larger than the rest, as the
    activations of large language models have (Dettmers et al., "LLM.int8()", 2022). A kernel
    that quantizes x too (int8 x int8 on the MXU instead of weight-only) scales each row or
    group by its largest value, and the other features lose their digits under it; on the
    task's own inputs the same shortcut is off by little more than the bf16 rounding."""
    x, wq, scales = make_inputs(case, rng)
    k = x.shape[-1]
    features = rng.choice(k, size=max(1, k // 128), replace=False)
    x = x.astype(np.float32)
    x[:, features] *= rng.uniform(50.0, 100.0, size=features.size).astype(np.float32)
    return x.astype(np_dtype(case.dtype)), wq, scales


CASES = (
    case_grid("train", "check", [dict(m=256, k=1024, n=512), dict(m=124, k=384, n=704)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim, a single row with a long K walk.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=136), dict(m=1, k=1536, n=256)],
                _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=4096)], _DTYPES)
    # Decode-like: few rows against a large, unaligned weight.
    + case_grid("heldout", "bench", [dict(m=16, k=8192, n=3000)], _DTYPES)
)

TASK = Task(
    name="dequant_matmul",
    version=2,
    level=2,
    description=("Weight-only int8 matmul: x @ (wq * scales) with per-output-column float32 "
                 "scales, dequantised inside the kernel; f32 accumulation, output in x.dtype."),
    signature="kernel(x[M, K], wq[K, N] int8, scales[N] float32) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(MXU_TOLERANCES),
    stresses=(Stress("outlier_features", "activations with one feature in 128 at 50-100 times the others",
                     outlier_inputs),),
)
