"""sliding_window_attention: causal attention restricted to the last W keys (a sliding window).

Query i attends to keys j with i - W < j <= i (itself and the W - 1 keys before it), as the
local attention layers of Mistral and Gemma-2 do: softmax(q @ k^T * head_dim**-0.5) @ v with
the softmax in float32; output in q.dtype. A window at least as long as the sequence is plain
causal attention.

W is the length of `window`, an int8 array of zeros whose values carry nothing (as
moe_router_topk reads k from its `slots`): kernels and references receive arrays only, so the
window is a per-case dim `w` that reaches the kernel as a shape.

Shapes from the models' configs (num_attention_heads, head_dim, sliding_window):
- Mistral-7B-v0.1: 32 heads, head_dim 128, sliding_window 4096; the train bench is one 8192-token
  prefill (twice the window: the first half of the queries see a growing causal prefix, the
  second half a full window) on the 16 heads of one chip of two (tensor parallel): all 32 on one
  v5e would not fit the reference, whose [h, s, s] logits and probabilities in bf16's float32
  math need 16.25 GiB of its 16 GiB HBM (libtpu's compile says so).
- Gemma-2-9B: 16 query heads, head_dim 256, sliding_window 4096 on its local layers (held out,
  on a prefill that is not a block multiple).
Check sizes keep the window several key blocks long and never a block multiple, so both of its
edges cross blocks.
Shapes from: Mistral-7B-v0.1, Gemma-2-9B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.references import HIGHEST, softmax_last_axis
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# q and k scaled so the logits have std ~2.25: the softmax is peaky (a few keys dominate each row),
# so outputs are O(0.1-1), not washed out by averaging many values of v.
_QK_SCALE = 1.5


def reference(q, k, v, window):
    w = window.shape[0]
    out_dtype = q.dtype
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) * q.shape[-1] ** -0.5
    query = jnp.arange(s.shape[-2])[:, None]
    key = jnp.arange(s.shape[-1])[None, :]
    visible = (key <= query) & (key > query - w)  # key i itself always: no empty row
    p = softmax_last_axis(jnp.where(visible, s, -jnp.inf))
    return jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=HIGHEST).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    if d["w"] < 1:
        raise ValueError(f"{case.name}: window w={d['w']} must be at least 1")
    shape = (d["b"], d["h"], d["s"], d["d"])
    return [ArgSpec(shape, case.dtype)] * 3 + [ArgSpec((d["w"],), "int8")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """window holds zeros (only its length counts)."""
    return [None, None, None, (0, 0)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, w_spec = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            np.zeros(w_spec.shape, np.int8))


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v, window = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v, window


CASES = (
    # Train: a window of 600 over 2048 positions (queries past 600 see a full window, whose
    # lower edge moves through the key blocks), and a ragged 700-position sequence with a
    # window of 300.
    case_grid("train", "check", [dict(b=1, h=2, s=2048, d=128, w=600),
                                 dict(b=1, h=2, s=700, d=128, w=300)], _DTYPES)
    # Held-out: Gemma-2's head_dim 256 on an unaligned sequence; head_dim 64 with a window
    # longer than the sequence (plain causal attention), batch 2.
    + case_grid("heldout", "check", [dict(b=1, h=2, s=1500, d=256, w=1000),
                                     dict(b=2, h=1, s=333, d=64, w=5000)], _DTYPES)
    # Mistral-7B: 32 heads of 128 split over 2 chips, window 4096, an 8192-token prefill.
    + case_grid("train", "bench", [dict(b=1, h=16, s=8192, d=128, w=4096)], _DTYPES)
    # Gemma-2-9B's local layers: 16 heads of 256, window 4096, a 6000-token prefill.
    + case_grid("heldout", "bench", [dict(b=1, h=16, s=6000, d=256, w=4096)], _DTYPES)
)

TASK = Task(
    name="sliding_window_attention",
    version=1,
    level=3,
    description=("Causal sliding-window attention (Mistral, Gemma-2 local layers): query i attends "
                 "to keys j with i - W < j <= i, W the length of window; softmax(q @ k^T * "
                 "head_dim**-0.5) @ v, softmax in float32; output in q.dtype."),
    signature=("kernel(q[B, H, S, D], k[B, H, S, D], v[B, H, S, D], window[W] int8) "
               "-> o[B, H, S, D]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    # The reference computes every logit; a kernel needs only the band inside the window. At
    # the bench sizes the band holds 37.5% (Mistral: (W(W+1)/2 + (s-W)W) / s^2 at s = 2W) and
    # 45% (Gemma-2, s=6000) of the logits.
    necessary_flops_share=0.35,
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),),
)
