"""linear_recurrence: a diagonal selective scan (Mamba-style SSM), computed in float32.

For each batch row and channel d, a state h_t[d, :] of size N evolves as
    h_t[d, n] = a_t[d] * h_{t-1}[d, n] + b_t[n] * x_t[d],    h_0 = 0,
and the output is y_t[d] = sum_n c_t[n] * h_t[d, n]. Output in x.dtype.

The train bench's D=2048, N=16 are Mamba-370M's d_inner (d_model 1024, expand 2) and d_state
(Mamba's decay also varies over the state axis; this one is per channel).
Shapes from: Mamba-370M.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(x, a, b, c):
    out_dtype = x.dtype
    x, a, b, c = (v.astype(jnp.float32) for v in (x, a, b, c))
    batch, _, dim = x.shape
    n = b.shape[-1]

    def step(h, inputs):  # h [B, D, N]; x_t, a_t [B, D]; b_t, c_t [B, N]
        x_t, a_t, b_t, c_t = inputs
        h = a_t[:, :, None] * h + x_t[:, :, None] * b_t[:, None, :]
        return h, jnp.sum(h * c_t[:, None, :], axis=-1)

    time_major = tuple(jnp.swapaxes(v, 0, 1) for v in (x, a, b, c))
    _, ys = lax.scan(step, jnp.zeros((batch, dim, n), jnp.float32), time_major)
    return jnp.swapaxes(ys, 0, 1).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    td, tn = (d["B"], d["T"], d["D"]), (d["B"], d["T"], d["N"])
    return [ArgSpec(td, case.dtype), ArgSpec(td, case.dtype),
            ArgSpec(tn, case.dtype), ArgSpec(tn, case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, a_spec, b_spec, c_spec = arg_specs(case)
    n = case.dims["N"]
    # Decays in [0.8, 0.99] (1 - a log-uniform): memories of 5 to 100 steps, so the state must
    # carry across chunk boundaries; the output is then O(0.5) with b and c of scale N**-0.5.
    a = 1.0 - np.exp(rng.uniform(np.log(0.01), np.log(0.2), size=a_spec.shape))
    return (normal(rng, x_spec.shape, case.dtype),
            a.astype(np.float32).astype(np_dtype(case.dtype)),
            normal(rng, b_spec.shape, case.dtype, scale=n ** -0.5),
            normal(rng, c_spec.shape, case.dtype, scale=n ** -0.5))


def long_memory_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Decays of 0.999 to 0.9999 (memories of 1,000 to 10,000 steps, as slow channels of
    state-space models have) and x scaled by 10 sqrt(1 - a^2), so the state stays O(1): the state
    of the first chunk still matters at the last, and a recurrence that drops or truncates what
    crosses chunk boundaries is off there, where the task's memories of 5 to 100 steps forget it."""
    x, _, b, c = make_inputs(case, rng)
    a_spec = arg_specs(case)[1]
    a = 1.0 - np.exp(rng.uniform(np.log(1e-4), np.log(1e-3), size=a_spec.shape))
    x = x.astype(np.float32) * np.sqrt(1.0 - a ** 2).astype(np.float32) * 10.0
    return (x.astype(np_dtype(case.dtype)), a.astype(np.float32).astype(np_dtype(case.dtype)), b, c)


CASES = (
    case_grid("train", "check", [dict(B=2, T=512, D=256, N=16), dict(B=2, T=300, D=320, N=16)],
              _DTYPES)
    # Held-out cases differ in kind: batch 1 with a long sequence, T and D not multiples of
    # 8 or 128, smaller and larger states.
    + case_grid("heldout", "check", [dict(B=1, T=1000, D=200, N=8), dict(B=3, T=77, D=128, N=32)],
                _DTYPES)
    + case_grid("train", "bench", [dict(B=4, T=4096, D=2048, N=16)], _DTYPES)
    + case_grid("heldout", "bench", [dict(B=1, T=6000, D=1500, N=8)], _DTYPES)
)

TASK = Task(
    name="linear_recurrence",
    version=2,
    level=3,
    description=("Diagonal linear recurrence / selective scan: h_t = a_t * h_{t-1} + b_t (x) x_t "
                 "per channel with state size N, h_0 = 0, y_t = sum_n c_t[n] * h_t[:, n]; "
                 "float32 state, output in x.dtype."),
    signature="kernel(x[B, T, D], a[B, T, D], b[B, T, N], c[B, T, N]) -> y[B, T, D]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("vmem_scratch",),
    heldout_task=True,
    stresses=(Stress("long_memory", "decays of 0.999 to 0.9999: memories longer than the sequence",
                     long_memory_inputs),),
)
