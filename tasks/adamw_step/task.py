"""adamw_step: one fused AdamW update of a weight matrix and its two moments, as optax.adamw and
torch.optim.AdamW compute it (decoupled weight decay, bias-corrected moments), in float32.

With the task's constant hyperparameters (LR, B1, B2, EPS, WEIGHT_DECAY below) and t = step >= 1:

    m'     = B1 * m + (1 - B1) * grad
    v'     = B2 * v + (1 - B2) * grad^2
    mhat   = m' / (1 - B1^t),   vhat = v' / (1 - B2^t)
    param' = param - LR * (mhat / (sqrt(vhat) + EPS) + WEIGHT_DECAY * param)

param and grad come in the case dtype (float32, or bfloat16 weights and gradients), the moments
m and v are always float32 optimizer state; param' is in param's dtype, m' and v' in float32.
step is a one-element int32 array (kernels receive arrays only). Every element is independent:
the work is memory bound, and a real optimizer updates param, m and v in place.

Shapes are weight matrices of real models: the train bench is Llama-3-8B's attention q_proj
(4096 x 4096) and its MLP gate/up projection (4096 x 14336); the held-out bench is Mistral-7B's
k_proj/v_proj (4096 x 1024: 8 kv heads of 128).

Inputs: weights of std 0.02 (the initializer range of Llama and GPT-style models); gradients
per row of scale 1e-4..1e-2 with a persistent mean (the true gradient) under noise of the same
size, and moments that are the state those gradients leave after step - 1 updates. Steps are
drawn from the first 32, where bias correction moves the update most (the start of training, or
a fine-tune with fresh moments); a stress regime takes late steps.
Shapes from: Llama-3-8B, Mistral-7B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype

_DTYPES = ("float32", "bfloat16")
LR = 1e-3
B1 = 0.9
B2 = 0.999
EPS = 1e-8
WEIGHT_DECAY = 0.01
MAX_STEP = 1_000_000   # what int_bounds declares; the default inputs draw 1..EARLY_STEPS
EARLY_STEPS = 32


def reference(param, grad, m, v, step):
    p, g = param.astype(jnp.float32), grad.astype(jnp.float32)
    t = step[0].astype(jnp.float32)
    m_new = B1 * m + (1.0 - B1) * g
    v_new = B2 * v + (1.0 - B2) * g * g
    mhat = m_new / (1.0 - jnp.power(jnp.float32(B1), t))
    vhat = v_new / (1.0 - jnp.power(jnp.float32(B2), t))
    p_new = p - LR * (mhat / (jnp.sqrt(vhat) + EPS) + WEIGHT_DECAY * p)
    return p_new.astype(param.dtype), m_new, v_new


def arg_specs(case: Case) -> list[ArgSpec]:
    shape = (case.dims["n"], case.dims["d"])
    return [ArgSpec(shape, case.dtype), ArgSpec(shape, case.dtype), ArgSpec(shape, "float32"),
            ArgSpec(shape, "float32"), ArgSpec((1,), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    shape = (case.dims["n"], case.dims["d"])
    return [ArgSpec(shape, case.dtype), ArgSpec(shape, "float32"), ArgSpec(shape, "float32")]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """step counts from 1."""
    return [None, None, None, None, (1, MAX_STEP)]


def _state(case: Case, rng: np.random.Generator, step: int, lo: float, hi: float) -> tuple[np.ndarray, ...]:
    """param, grad, m, v for a step, gradients of a per-row scale log-uniform in [lo, hi]."""
    n, d = case.dims["n"], case.dims["d"]
    sigma = np.exp(rng.uniform(np.log(lo), np.log(hi), size=(n, 1)))
    mu = rng.standard_normal((n, d)) * sigma                      # the persistent gradient
    grad = mu + rng.standard_normal((n, d)) * sigma               # this step's: mean plus noise
    # The moments after step - 1 updates by gradients mu + noise, without bias correction: m's
    # noise has the std of an EMA of step - 1 noises, v holds mu^2 plus the noise's power.
    prev = step - 1
    m_noise = (1 - B1) * np.sqrt((1 - B1 ** (2 * prev)) / (1 - B1 ** 2))
    m = (1 - B1 ** prev) * mu + m_noise * sigma * rng.standard_normal((n, d))
    power = np.mean(rng.standard_normal((8, n, d)) ** 2, axis=0)  # chi-square(8) / 8
    v = (1 - B2 ** prev) * (mu * mu + sigma * sigma * power)
    return (normal(rng, (n, d), case.dtype, scale=0.02), grad.astype(np.float32).astype(np_dtype(case.dtype)),
            m.astype(np.float32), v.astype(np.float32))


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    step = int(rng.integers(1, EARLY_STEPS + 1))
    return (*_state(case, rng, step, 1e-4, 1e-2), np.array([step], np.int32))


def tiny_gradient_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Gradients of scale 1e-10..1e-8 (parameters whose gradients all but vanish: deep layers
    late in training, embedding rows of rare tokens), so sqrt(vhat) is of the order of EPS:
    EPS inside the square root, or added before the bias correction, is off by far there."""
    step = int(rng.integers(1, EARLY_STEPS + 1))
    return (*_state(case, rng, step, 1e-10, 1e-8), np.array([step], np.int32))


def late_step_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Steps of 1,000 to 1,000,000 (log-uniform), where B2^t is far from 1 or underflows and the
    moments are full: bias corrections computed by a method that only holds for small t (an
    unrolled power, a float16 step) are off there."""
    step = int(np.exp(rng.uniform(np.log(1000), np.log(MAX_STEP))))
    return (*_state(case, rng, step, 1e-4, 1e-2), np.array([step], np.int32))


CASES = (
    # The second is off the (8, 128) tile in rows and lanes.
    case_grid("train", "check", [dict(n=512, d=1024), dict(n=1036, d=576)], _DTYPES)
    # Held-out shapes differ in kind: a single row (a bias or norm vector) of unaligned width, a
    # width over one lane block and no multiple of 128.
    + case_grid("heldout", "check", [dict(n=1, d=1000), dict(n=200, d=3000)], _DTYPES)
    # Llama-3-8B: q_proj 4096 x 4096, MLP gate/up 4096 x 14336.
    + case_grid("train", "bench", [dict(n=4096, d=4096), dict(n=4096, d=14336)], _DTYPES)
    # Mistral-7B: k_proj / v_proj 4096 x 1024.
    + case_grid("heldout", "bench", [dict(n=4096, d=1024)], _DTYPES)
)

TASK = Task(
    name="adamw_step",
    version=1,
    level=1,
    description=("One fused AdamW step (lr 1e-3, betas 0.9/0.999, eps 1e-8, decoupled weight decay "
                 "0.01, bias-corrected moments at step t >= 1), computed in float32; param' in "
                 "param.dtype, the moments float32."),
    signature=("kernel(param[n, d], grad[n, d], m[n, d] float32, v[n, d] float32, step[1] int32) "
               "-> (param'[n, d], m'[n, d] float32, v'[n, d] float32)"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    int_bounds=int_bounds,
    stresses=(Stress("tiny_gradients", "gradients of 1e-10 to 1e-8, where sqrt(vhat) is of the order of eps",
                     tiny_gradient_inputs),
              Stress("late_steps", "steps of 1,000 to 1,000,000, where the bias corrections are near 1",
                     late_step_inputs)),
)
