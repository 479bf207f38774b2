"""swiglu_mlp: (silu(x[M, D] @ w_gate[D, F]) * (x @ w_up[D, F])) @ w_down[F, D] -> [M, D].

The train bench's d=2048, f=5632 are TinyLlama-1.1B's hidden_size and intermediate_size.
Shapes from: TinyLlama-1.1B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import GATED_MXU_TOLERANCES, ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")
_HI = lax.Precision.HIGHEST


def reference(x, w_gate, w_up, w_down):
    out_dtype = x.dtype
    x, w_gate, w_up, w_down = (a.astype(jnp.float32) for a in (x, w_gate, w_up, w_down))
    h = jax.nn.silu(jnp.dot(x, w_gate, precision=_HI)) * jnp.dot(x, w_up, precision=_HI)
    return jnp.dot(h, w_down, precision=_HI).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["d"]), case.dtype), ArgSpec((d["d"], d["f"]), case.dtype),
            ArgSpec((d["d"], d["f"]), case.dtype), ArgSpec((d["f"], d["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["d"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, wg_spec, wu_spec, wd_spec = arg_specs(case)
    # Gate and up projections scaled by 1/sqrt(D) are O(1) (silu in its curved region); w_down
    # scaled by 1/sqrt(F) keeps the output O(0.5) whatever F is.
    d, f = case.dims["d"], case.dims["f"]
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, wg_spec.shape, case.dtype, scale=d ** -0.5),
            normal(rng, wu_spec.shape, case.dtype, scale=d ** -0.5),
            normal(rng, wd_spec.shape, case.dtype, scale=f ** -0.5))


CASES = (
    case_grid("train", "check", [dict(m=256, d=512, f=1024), dict(m=140, d=448, f=320)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim (padded F columns must contribute
    # nothing), a single row with many F tiles.
    + case_grid("heldout", "check", [dict(m=200, d=300, f=700), dict(m=1, d=256, f=1536)], _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, d=2048, f=5632)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, d=1000, f=2730)], _DTYPES)
)

TASK = Task(
    name="swiglu_mlp",
    version=2,
    level=2,
    description=("Fused SwiGLU MLP: (silu(x @ w_gate) * (x @ w_up)) @ w_down without the hidden "
                 "activation in HBM; f32 accumulation, output in x.dtype."),
    signature="kernel(x[M, D], w_gate[D, F], w_up[D, F], w_down[F, D]) -> [M, D]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(GATED_MXU_TOLERANCES),
    required_features=("vmem_scratch",),
)
