"""causal_depthwise_conv1d: the short causal depthwise convolution of Mamba and Mamba2 blocks,
followed by SiLU.

Every channel c of x[b, l, c] is filtered on its own by a kw-tap filter w[:, c], causally: the
output at time t sees x at times t - (kw - 1) .. t, and times before 0 are zero (left padding
of kw - 1). With a per-channel bias:
    y[b, t, c] = bias[c] + sum_{j < kw} w[j, c] * x[b, t - (kw - 1) + j, c]
and the output is silu(y) = y * sigmoid(y), computed in float32; output in x.dtype.

Shapes from the models that run it (their `conv1d` before the SSM scan, d_conv = kw = 4):
- Mamba2-2.7B: d_model 2560, expand 2 -> d_inner 5120, ngroups 1, d_state 128, so the conv
  runs over d_inner + 2 * ngroups * d_state = 5376 channels (x, B and C together): the train
  bench case.
- Mamba2-1.3B: d_model 2048 -> d_inner 4096, + 2 * 128 = 4352 channels: the held-out bench.
- Mamba-2.8B (Mamba1): d_inner 5120, the conv over x alone; the check sizes scale these down.
Held-out check cases use a 3-tap filter and channel counts off the 128-lane tile.
Shapes from: Mamba2-2.7B, Mamba2-1.3B, Mamba-2.8B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, w, bias):
    kw = w.shape[0]
    length = x.shape[1]
    xp = jnp.pad(x.astype(jnp.float32), ((0, 0), (kw - 1, 0), (0, 0)))  # zeros before time 0
    y = bias.astype(jnp.float32)
    for j in range(kw):
        y = y + w[j].astype(jnp.float32) * xp[:, j:j + length, :]
    return jax.nn.silu(y).astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["b"], d["l"], d["c"]), case.dtype),
            ArgSpec((d["kw"], d["c"]), case.dtype),
            ArgSpec((d["c"],), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec, b_spec = arg_specs(case)
    # Filter taps of scale kw**-0.5 (as PyTorch's default Conv1d init, fan-in kw for a depthwise
    # conv) keep y of order 1, where silu is neither linear nor zero; a bias of scale 0.5 that
    # a kernel must not drop.
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=case.dims["kw"] ** -0.5),
            normal(rng, b_spec.shape, case.dtype, scale=0.5))


CASES = (
    # Train: a sequence of two 512-row time blocks, and a ragged one (time and channels off the
    # tile).
    case_grid("train", "check", [dict(b=2, l=1024, c=256, kw=4), dict(b=3, l=700, c=200, kw=4)],
              _DTYPES)
    # Held-out: a 3-tap filter, batch 1, a ragged time length; channels off the 128-lane tile.
    + case_grid("heldout", "check", [dict(b=1, l=1500, c=136, kw=3), dict(b=3, l=250, c=1000, kw=4)],
                _DTYPES)
    # Mamba2-2.7B's conv (5376 channels), 4 sequences of 4096 tokens.
    + case_grid("train", "bench", [dict(b=4, l=4096, c=5376, kw=4)], _DTYPES)
    # Mamba2-1.3B's conv (4352 channels), 2 sequences of 6000 tokens (not a block multiple).
    + case_grid("heldout", "bench", [dict(b=2, l=6000, c=4352, kw=4)], _DTYPES)
)

TASK = Task(
    name="causal_depthwise_conv1d",
    version=1,
    level=1,
    description=("Mamba's short causal depthwise convolution with SiLU: per channel, "
                 "y[t] = bias + sum_j w[j] * x[t - (kw-1) + j] with zeros before time 0, then "
                 "silu(y), computed in float32; output in x.dtype."),
    signature="kernel(x[b, l, c], w[kw, c], bias[c]) -> [b, l, c]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
)
