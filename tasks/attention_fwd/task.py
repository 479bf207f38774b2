"""attention_fwd: softmax(q @ k^T * head_dim**-0.5) @ v over [batch, heads, seq, head_dim], no mask.

The reference is tasks/references.py's attention_reference; build_task is shared with
attention_fwd_causal, which passes causal=True.
"""
from pathlib import Path

import numpy as np

from tasks.references import attention_reference
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# q and k scaled so the logits have std ~2.25: the softmax is peaky (a few keys dominate each row),
# so outputs are O(0.1-1), not washed out to ~0 by averaging many values of v.
_QK_SCALE = 1.5


def reference(q, k, v):
    return attention_reference(q, k, v, causal=False)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    shape = (d["b"], d["h"], d["s"], d["d"])
    return [ArgSpec(shape, case.dtype)] * 3


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype))


# Check sizes keep every TPU-interpret grid at <= 16 steps with 128-row blocks.
CASES = (
    case_grid("train", "check", [dict(b=2, h=2, s=256, d=128), dict(b=1, h=2, s=300, d=128)], _DTYPES)
    # Held-out shapes differ in kind: a sequence that is not a multiple of 128 (padding and
    # masking of padded keys), head_dim 64, batch 1.
    + case_grid("heldout", "check", [dict(b=1, h=2, s=200, d=128), dict(b=1, h=3, s=256, d=64)],
                _DTYPES)
    + case_grid("train", "bench", [dict(b=4, h=16, s=4096, d=128)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=1, h=8, s=3000, d=64)], _DTYPES)
)


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v


def build_task(*, name: str, description: str, reference_fn, solution_path: Path,
               necessary_flops_share: float = 1.0) -> Task:
    """An attention-forward task over the shared cases; the two variants differ only in the mask."""
    return Task(
        name=name,
        version=2,
        level=3,
        description=description,
        signature="kernel(q[B, H, S, D], k[B, H, S, D], v[B, H, S, D]) -> o[B, H, S, D]",
        reference=reference_fn,
        arg_specs=arg_specs,
        make_inputs=make_inputs,
        out_specs=out_specs,
        cases=tuple(CASES),
        solution_path=solution_path,
        required_features=(),
        tolerances=dict(ATTENTION_TOLERANCES),
        necessary_flops_share=necessary_flops_share,
        stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),),
    )


TASK = build_task(
    name="attention_fwd",
    description=("Multi-head attention forward, no mask: softmax(q @ k^T * head_dim**-0.5) @ v, "
                 "softmax in float32; output in q.dtype."),
    reference_fn=reference,
    solution_path=Path(__file__).with_name("solution.py"),
)
