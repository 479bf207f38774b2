"""gemm_softmax: softmax(x[M, K] @ w[K, N], axis=-1) -> [M, N], logits and softmax in float32."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Task, Tolerance, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x, w):
    logits = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return jax.nn.softmax(logits, axis=-1).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["m"], d["k"]), case.dtype), ArgSpec((d["k"], d["n"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["n"]), case.dtype)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    m, k, n = case.dims["m"], case.dims["k"], case.dims["n"]
    # Logits = row offset + 3 * N(0, 1)-like: feature 0 of x carries a per-row offset of
    # +-(90-110), random sign, and row 0 of w is all ones, so every logit of a row shares it
    # (softmax is unchanged by it). A positive offset overflows exp in float32 unless the
    # kernel subtracts the row max; in a negative row a zero-padded column that is not masked
    # (logit exactly 0) takes all the probability. The other features make rows peaky.
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[:, 0] = rng.uniform(90.0, 110.0, size=m) * rng.choice([-1.0, 1.0], size=m)
    w = rng.standard_normal((k, n), dtype=np.float32) * (3.0 / np.sqrt(k - 1))
    w[0, :] = 1.0
    return x.astype(np_dtype(case.dtype)), w.astype(np_dtype(case.dtype))


# One row of softmax over default-precision logits (the m=1 held-out case) varies widely with
# the seed: the solution's relative L2 error reached 1.14e-2 over 20 seeds (0.76 of the
# attention family's 1.5e-2), the other cases 5e-3; the f32 bound is about twice the worst.
TOLERANCES = {**ATTENTION_TOLERANCES,
              "float32": Tolerance(atol=0.12, rtol=0.12, rel_l2=2.5e-2)}

CASES = (
    case_grid("train", "check", [dict(m=512, k=1024, n=256), dict(m=140, k=320, n=704)], _DTYPES)
    # Held-out shapes differ in kind: unaligned in every dim (padded columns must be masked),
    # a single row with a long K loop.
    + case_grid("heldout", "check", [dict(m=200, k=300, n=200), dict(m=1, k=1536, n=384)],
                _DTYPES)
    + case_grid("train", "bench", [dict(m=4096, k=4096, n=2048)], _DTYPES)
    + case_grid("heldout", "bench", [dict(m=3000, k=5000, n=1000)], _DTYPES)
)

TASK = Task(
    name="gemm_softmax",
    version=2,
    level=2,
    description=("Fused GEMM + softmax: softmax(x @ w, axis=-1) with f32 accumulation and "
                 "softmax, logits never in HBM; output in x.dtype."),
    signature="kernel(x[M, K], w[K, N]) -> [M, N]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(TOLERANCES),
)
