"""multi_query_attention: every query head attends to one shared key/value head, no mask.

o[b, h] = softmax(q[b, h] @ k[b, 0]^T * head_dim**-0.5) @ v[b, 0] for every query head h.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.references import attention_reference
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# As in attention_fwd: q and k scaled so the logits have std ~2.25 and the softmax is peaky,
# keeping outputs O(0.1-1) instead of washed out by averaging many values of v.
_QK_SCALE = 1.5


def reference(q, k, v):
    """Plain-jnp attention in float32 with k and v broadcast to every query head."""
    heads = q.shape[1]
    k, v = (jnp.broadcast_to(x, x.shape[:1] + (heads,) + x.shape[2:]) for x in (k, v))
    return attention_reference(q, k, v, causal=False)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    kv = ArgSpec((d["b"], 1, d["s"], d["d"]), case.dtype)
    return [ArgSpec((d["b"], d["hq"], d["s"], d["d"]), case.dtype), kv, kv]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype))


# Check sizes keep the TPU-interpret grid small (<= ~16 steps) for a kernel that takes up to 512
# query rows (of one or several heads) per block and 128 keys per block.
def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v


CASES = (
    case_grid("train", "check", [dict(b=2, hq=4, s=256, d=128), dict(b=1, hq=4, s=300, d=128)],
              _DTYPES)
    # Held-out shapes differ in kind: batch 1, head_dim 64, a sequence that is not a multiple
    # of 128 (padded keys), head counts that do not divide a 512-row block, a longer sequence.
    + case_grid("heldout", "check", [dict(b=1, hq=6, s=200, d=64), dict(b=1, hq=3, s=384, d=128)],
                _DTYPES)
    + case_grid("train", "bench", [dict(b=4, hq=16, s=4096, d=128)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=1, hq=12, s=3000, d=64)], _DTYPES)
)

TASK = Task(
    name="multi_query_attention",
    version=2,
    level=3,
    description=("Multi-query attention, no mask: all query heads share one key/value head; "
                 "o[:, h] = softmax(q[:, h] @ k[:, 0]^T * head_dim**-0.5) @ v[:, 0], softmax in "
                 "float32; output in q.dtype."),
    signature="kernel(q[B, Hq, S, D], k[B, 1, S, D], v[B, 1, S, D]) -> o[B, Hq, S, D]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    required_features=(),
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),),
)
