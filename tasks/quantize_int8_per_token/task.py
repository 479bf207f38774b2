"""quantize_int8_per_token: symmetric int8 quantisation of activations x[M, D], one scale per row.

As LLM.int8() (Dettmers et al., 2022: vector-wise quantisation of the hidden states) and
SmoothQuant (Xiao et al., 2023: per-token dynamic activation quantisation) do before an int8
matmul, in float32:

    scale[i] = max_j |x[i, j]| / 127          (1 for a row that is all zeros)
    q[i, j]  = clip(round(x[i, j] / scale[i]), -127, 127)   as int8

round is round-half-to-even (jnp.round, torch.round). Returns (q[M, D] int8, scale[M] float32);
x * scale[:, None] dequantises q. Integer outputs are compared as numbers: see the tolerance.

Shapes from real models: the train bench quantises Llama-3-8B activations over one 8192-token
prefill, its hidden size 4096 (the input of the q/k/v and gate/up projections) and its MLP width
14336 (the input of down_proj); the held-out bench uses Llama-2-13B's 5120 and 13824 over 3000
and 2000 tokens, row counts no multiple of a row block.
Shapes from: Llama-3-8B, Llama-2-13B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Stress, Task, Tolerance, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")
QMAX = 127.0


def reference(x):
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)                 # [M, 1]
    scale = jnp.where(amax > 0, amax / QMAX, 1.0)
    q = jnp.clip(jnp.round(xf / scale), -QMAX, QMAX).astype(jnp.int8)
    return q, scale[:, 0]


def arg_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["d"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    m, d = case.dims["m"], case.dims["d"]
    return [ArgSpec((m, d), "int8"), ArgSpec((m,), "float32")]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # N(0, 1) rows each scaled by its own factor, log-uniform over [0.25, 4] (tokens' hidden
    # states differ in norm): scales spread over 16x, so a constant or shared scale fails, and
    # a row's largest magnitude is as often negative as positive, so max(x) for max(|x|) fails.
    m, d = case.dims["m"], case.dims["d"]
    row_scale = np.exp(rng.uniform(np.log(0.25), np.log(4.0), size=(m, 1))).astype(np.float32)
    x = rng.standard_normal((m, d), dtype=np.float32) * row_scale
    return (x.astype(np_dtype(case.dtype)),)


def zero_row_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The task's rows with about a quarter of them (at least one) all zeros, as the padded
    slots of a batch or of an MoE expert's capacity buffer are: max |x| is 0 there, so a kernel
    that divides by it without the task's rule (scale 1, q 0) returns NaN or a scale of 0."""
    (x,) = make_inputs(case, rng)
    zero = rng.random(x.shape[0]) < 0.25
    zero[rng.integers(0, x.shape[0])] = True
    x = x.copy()
    x[zero] = 0
    return (x,)


CASES = (
    # Both span several row blocks; the second is off the (8, 128) tile (and int8's 32-row
    # tile) in rows and lanes, with a ragged last row block.
    case_grid("train", "check", [dict(m=512, d=1024), dict(m=300, d=448)], _DTYPES)
    # Held-out shapes differ in kind: unaligned d with fewer rows than one tile, a single long
    # row, three row blocks with a ragged last one over a narrow d.
    + case_grid("heldout", "check", [dict(m=45, d=1000), dict(m=1, d=3000), dict(m=700, d=320)],
                _DTYPES)
    # Llama-3-8B over an 8192-token prefill: hidden 4096 and MLP width 14336.
    + case_grid("train", "bench", [dict(m=8192, d=4096), dict(m=8192, d=14336)], _DTYPES)
    # Llama-2-13B: hidden 5120 over 3000 tokens, MLP width 13824 over 2000 tokens.
    + case_grid("heldout", "bench", [dict(m=3000, d=5120), dict(m=2000, d=13824)], _DTYPES)
)

# One bound for both outputs (q as numbers, scale). Measured on these inputs by emulating kernels
# in numpy: q = round(x * (127 / amax)) or round(x * (1 / scale)) instead of x / scale, and round
# half away from zero instead of to even, move single elements of q by one where x / scale is at
# or within an ulp of a half: none or one element in f32, but bf16 inputs put exact halves on the
# grid (x = amax * (k + 0.5) / 127), so up to 0.05% of q's elements, relative L2 <= 1.2e-3 (the
# rounding rule) and <= 7.4e-4 (a reciprocal). Wrong kernels: truncation toward zero (astype
# alone) is off by 1.8e-2..2.3e-2, a divisor of 128 by 1.2e-2..1.4e-2, the row max taken from x
# rounded to bf16 (f32 inputs) by 6e-3..8e-3. So rel_l2 3e-3, and an element bound that lets any
# element of q be one off (0.05 * rms(q) >= 1.4 here: rms(q) is 29-40) and leaves the judgement
# to the L2 bound; the scale, computed as the reference does, is exact or one float32 ulp off.
_TOL = Tolerance(atol=5e-2, rtol=1e-2, rel_l2=3e-3)

TASK = Task(
    name="quantize_int8_per_token",
    version=1,
    level=1,
    description=("Per-token symmetric int8 quantisation: scale = max|x| over the row / 127 (1 for "
                 "an all-zero row), q = clip(round_half_even(x / scale), -127, 127), in float32; "
                 "returns (q int8, scale float32)."),
    signature="kernel(x[M, D]) -> (q[M, D] int8, scale[M] float32)",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances={"float32": _TOL, "bfloat16": _TOL},
    stresses=(Stress("zero_rows", "about a quarter of the rows all zeros (padded slots)", zero_row_inputs),),
)
