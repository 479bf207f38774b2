"""rg_lru: the Real-Gated Linear Recurrent Unit of Griffin / RecurrentGemma (De et al. 2024,
"Griffin: Mixing Gated Linear Recurrences with Local Attention for Efficient Language Models"),
the recurrence of its recurrent blocks, computed in float32.

Given x[b, t, d], the recurrence gate r and the input gate i (both [b, t, d], already through
their sigmoids, so in (0, 1)) and the per-channel parameter lam[d], with c = 8:

    log_a_t = -c * r_t * softplus(lam)
    a_t     = exp(log_a_t)
    h_t     = a_t * h_{t-1} + sqrt(1 - a_t^2) * (i_t * x_t),    h_0 = 0

and the output is every h_t, in x.dtype. 1 - a_t^2 is -expm1(2 log_a_t): a_t is close to 1 for
slow channels and closed gates, where 1 - a * a keeps few digits. The sequence axis is a scan:
a kernel carries h from one time block to the next (a sequential grid axis and a float32 VMEM
state).

Widths and lengths of real models: the train bench is RecurrentGemma-2B's lru width 2560 over
two 8192-token sequences (its training length) and RecurrentGemma-9B's lru width 4096 over one
4096-token sequence; the held-out bench is a width that is neither (1536 = 12 x 128) over 6000
tokens, a length that is no multiple of a time block.

Inputs: lam as RecurrentGemma initialises it (a^c's radius uniform on its square in
[0.9^2, 0.999^2], i.e. softplus(lam) = -log(radius) in [0.001, 0.105]); gates as sigmoids of
standard normals; x standard normal. Memories then run from a few steps to a few hundred.
Shapes from: RecurrentGemma-2B, RecurrentGemma-9B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype

_DTYPES = ("float32", "bfloat16")
C = 8.0


def reference(x, r, i, lam):
    out_dtype = x.dtype
    x, r, i, lam = (v.astype(jnp.float32) for v in (x, r, i, lam))
    log_a = -C * r * jax.nn.softplus(lam)              # [b, t, d]
    a = jnp.exp(log_a)
    multiplier = jnp.sqrt(-jnp.expm1(2.0 * log_a))     # sqrt(1 - a^2), stable as a -> 1
    u = multiplier * (i * x)

    def step(h, inputs):  # h, a_t, u_t: [b, d]
        a_t, u_t = inputs
        h = a_t * h + u_t
        return h, h

    _, hs = lax.scan(step, jnp.zeros((x.shape[0], x.shape[2]), jnp.float32),
                     (jnp.swapaxes(a, 0, 1), jnp.swapaxes(u, 0, 1)))
    return jnp.swapaxes(hs, 0, 1).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    btd = (d["b"], d["t"], d["d"])
    return [ArgSpec(btd, case.dtype), ArgSpec(btd, case.dtype), ArgSpec(btd, case.dtype),
            ArgSpec((d["d"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _lam(rng: np.random.Generator, d: int) -> np.ndarray:
    """RecurrentGemma's init: softplus(lam) = -log(radius), radius^2 uniform in [0.81, 0.998]."""
    radius = np.sqrt(rng.uniform(0.9 ** 2, 0.999 ** 2, size=d))
    return np.log(np.expm1(-np.log(radius)))          # softplus^-1


def _inputs(case: Case, rng: np.random.Generator, r_shift: float) -> tuple[np.ndarray, ...]:
    x_spec = arg_specs(case)[0]
    dt = np_dtype(case.dtype)
    r, i = (_sigmoid(rng.standard_normal(x_spec.shape) + shift).astype(np.float32).astype(dt)
            for shift in (r_shift, 0.0))
    return (normal(rng, x_spec.shape, case.dtype), r, i,
            _lam(rng, case.dims["d"]).astype(np.float32).astype(dt))


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return _inputs(case, rng, 0.0)


def closed_gate_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Recurrence gates near closed (r = sigmoid(N(-5, 1)), about 0.007): the gate holding its
    memory, a_t within 1e-5..1e-2 of 1, memories of hundreds to thousands of steps. The state of
    the first time block still matters at the last, and 1 - a^2 is where a naive 1 - a * a
    loses its digits."""
    return _inputs(case, rng, -5.0)


CASES = (
    # Both span two time blocks (the state carries across a grid step); the second is off the
    # (8, 128) tile in time and channels, with a ragged last time block.
    case_grid("train", "check", [dict(b=2, t=1024, d=256), dict(b=2, t=596, d=320)], _DTYPES)
    # Held-out cases differ in kind: batch 1 with unaligned channels, a sequence shorter than
    # one time block, more batch rows over wider channels.
    + case_grid("heldout", "check", [dict(b=1, t=1000, d=200), dict(b=3, t=77, d=384)], _DTYPES)
    # RecurrentGemma-2B (lru width 2560) and -9B (4096).
    + case_grid("train", "bench", [dict(b=2, t=8192, d=2560), dict(b=1, t=4096, d=4096)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=1, t=6000, d=1536)], _DTYPES)
)

TASK = Task(
    name="rg_lru",
    version=1,
    level=3,
    description=("Griffin / RecurrentGemma's RG-LRU: log_a = -8 * r * softplus(lam), a = exp(log_a), "
                 "h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * (i_t * x_t) per channel, h_0 = 0, gates r "
                 "and i in (0, 1); float32 state, output (every h_t) in x.dtype."),
    signature="kernel(x[b, t, d], r[b, t, d], i[b, t, d], lam[d]) -> h[b, t, d]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("vmem_scratch",),
    stresses=(Stress("closed_gates", "recurrence gates near closed: a_t within 1e-5 to 1e-2 of 1, memories of thousands of steps",
                     closed_gate_inputs),),
)
