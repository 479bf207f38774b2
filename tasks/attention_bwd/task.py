"""attention_bwd: gradients dq, dk, dv of softmax(q @ k^T * head_dim**-0.5) @ v, no mask.

Given q, k, v, the forward output o, the row logsumexp lse of the scaled logits and the output
gradient do, compute dq, dk, dv (what a flash-attention backward pass does). The reference is
jax.vjp of the plain float32 attention, so it depends only on q, k, v and do; o and lse are
inputs a kernel may use (to recompute the probabilities as exp(s - lse) and the row sums
delta = sum(o * do, -1)) and make_inputs builds them consistently from q, k, v.

The reference is tasks/references.py's attention_bwd_reference; the input builders and cases
here are shared with attention_bwd_causal, which passes causal=True.
"""
from pathlib import Path

import numpy as np

from tasks.references import attention_bwd_reference
from tasks.spec import ArgSpec, Case, Stress, Task, Tolerance, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# As in attention_fwd: q and k scaled so the softmax rows are peaky.
_QK_SCALE = 1.5
# Spikes: this fraction of q and k entries is multiplied by _SPIKE. Real activations have rare
# large entries; they make a few logits (and gradients) much larger than the rest, which is where
# a wrong scale or a dropped term shows while a pointwise check on Gaussian data might not.
_SPIKE_FRACTION = 0.01
_SPIKE = 8.0

# Gradients of a spiky softmax have heavy-tailed honest errors (a bf16-rounded dS entry times a
# spike of k can land where dq is near zero), so the element-wise bound is loose (atol = 1x the
# output's rms, rtol 0.1) and the relative L2 error does the judging. Worst-output rel_l2 measured
# on the check cases (40-80 seeds each, numpy emulation of the kernels' roundings, confirmed on
# the Pallas kernels): exact f32 kernel 5e-6; f32 kernel with f32 logits but single-pass bf16
# operands in the other four matmuls 7e-3..1.0e-2 (passes f32); bf16 kernel with bf16 p and dS
# 4e-3..6e-3 (mostly from the bf16 o in delta). A f32 kernel whose logits too come from
# bf16-rounded q and k (its QK^T at default precision: what a TPU does, and what the evaluator
# emulates) lands at 3.4e-2..6.6e-2, because p = exp(s - lse) against the given exact lse
# magnifies logit errors; jax's own flash-attention backward is such a kernel. That is more
# than one visibly corrupted block gives (0.5 std added to 1/256 of an output: 6.3e-2), so the
# f32 bound cannot accept it: f32 cases ask for accurate logits (precision=HIGHEST on QK^T).
# Wrong kernels (delta dropped, a scale missing or doubled, p where p^T belongs) are at >= 0.7.
TOLERANCES = {
    "float32": Tolerance(atol=1.0, rtol=0.1, rel_l2=2e-2),
    "bfloat16": Tolerance(atol=1.0, rtol=0.1, rel_l2=3e-2),
}


# The reference takes jax.vjp of the forward, which computes the forward's output too: six
# [S, S] x [S, D] matmuls (s = q k^T, o = p v, dv, dp, dq, dk), of which a kernel given o and
# lse needs five (o is an input).
GRADIENT_MATMULS_SHARE = 5 / 6


def reference(q, k, v, o, lse, do):
    return attention_bwd_reference(q, k, v, o, lse, do, causal=False)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    shape = (d["b"], d["h"], d["s"], d["d"])
    x = ArgSpec(shape, case.dtype)
    return [x, x, x, x, ArgSpec(shape[:3], "float32"), x]  # q, k, v, o, lse, do


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:3]  # dq, dk, dv


def spiky(rng: np.random.Generator, shape, dtype: str, scale: float) -> np.ndarray:
    """Gaussian times `scale`, with _SPIKE_FRACTION of the entries _SPIKE times larger."""
    x = normal(rng, shape, "float32", scale=scale)
    x = np.where(rng.random(shape) < _SPIKE_FRACTION, x * _SPIKE, x)
    return x.astype(np_dtype(dtype))


def forward_stats(q, k, v, *, causal: bool):
    """(o, lse) of attention in float64 numpy (no jax here: the host must not claim a device).
    One (batch, head) slice at a time: numpy's batched matmul calls BLAS per slice anyway, so the
    values are the same, and a coverage-size input (16 heads of 4096) needs no 2 GiB float64
    temporaries: 7 s here against 13 s batched (47 s while those 8 GiB were first touched)."""
    o = np.empty(q.shape, np.float64)
    lse = np.empty(q.shape[:-1], np.float64)
    for index in np.ndindex(q.shape[:-2]):
        o[index], lse[index] = _slice_stats(*(np.asarray(x[index], np.float64) for x in (q, k, v)),
                                            causal=causal)
    return o, lse


def _slice_stats(q, k, v, *, causal: bool):
    """(o, lse) of one [seq, head_dim] slice."""
    # matmul (BLAS), not einsum: einsum's own loops took 5 s per grading at these sizes.
    s = np.matmul(q, k.T) * q.shape[-1] ** -0.5
    if causal:
        seq_q, seq_k = s.shape
        s = np.where(np.arange(seq_q)[:, None] >= np.arange(seq_k)[None, :], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    return np.matmul(e / l, v), (m + np.log(l))[..., 0]


def make_inputs_for(case: Case, rng: np.random.Generator, *, causal: bool, large_logits: bool = False):
    """`large_logits`: the stress regime's q and k (tasks/stresses.py, logit_offset)."""
    specs = arg_specs(case)
    q = spiky(rng, specs[0].shape, case.dtype, _QK_SCALE)
    k = spiky(rng, specs[1].shape, case.dtype, _QK_SCALE)
    if large_logits:
        q, k = (x.astype(np_dtype(case.dtype)) for x in logit_offset(q, k, rng))
    v = normal(rng, specs[2].shape, case.dtype)
    do = normal(rng, specs[5].shape, case.dtype)
    # o and lse from the dtype-rounded q, k, v: exactly the forward pass of these inputs.
    o, lse = forward_stats(q, k, v, causal=causal)
    return q, k, v, o.astype(np_dtype(case.dtype)), lse.astype(np.float32), do


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return make_inputs_for(case, rng, causal=False)


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return make_inputs_for(case, rng, causal=False, large_logits=True)


# Check sizes keep each of a flash backward's two TPU-interpret grids at <= 16 steps with
# 128-row blocks; one shape per split keeps the check run short (two kernels per case).
CASES = (
    case_grid("train", "check", [dict(b=2, h=2, s=256, d=128), dict(b=1, h=2, s=180, d=128)], _DTYPES)
    # Held out, different in kind: batch 1, head_dim 64 and a sequence that is not a multiple of
    # 128 (padded queries and keys).
    + case_grid("heldout", "check", [dict(b=1, h=3, s=200, d=64)], _DTYPES)
    + case_grid("train", "bench", [dict(b=4, h=16, s=4096, d=128)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=1, h=8, s=3000, d=64)], _DTYPES)
)


def build_task(*, name: str, description: str, reference_fn, make_inputs_fn, large_logit_inputs_fn,
               solution_path: Path, necessary_flops_share: float = 1.0) -> Task:
    """An attention-backward task over the shared cases; the two variants differ only in the mask."""
    return Task(
        name=name,
        version=2,
        level=3,
        description=description,
        signature=("kernel(q[B, H, S, D], k[B, H, S, D], v[B, H, S, D], o[B, H, S, D], "
                   "lse[B, H, S] float32, do[B, H, S, D]) -> (dq, dk, dv), each [B, H, S, D]"),
        reference=reference_fn,
        arg_specs=arg_specs,
        make_inputs=make_inputs_fn,
        out_specs=out_specs,
        cases=tuple(CASES),
        solution_path=solution_path,
        required_features=(),
        tolerances=dict(TOLERANCES),
        necessary_flops_share=necessary_flops_share * GRADIENT_MATMULS_SHARE,
        stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs_fn),),
    )


TASK = build_task(
    name="attention_bwd",
    description=("Multi-head attention backward, no mask: dq, dk, dv of "
                 "softmax(q @ k^T * head_dim**-0.5) @ v given o, lse (natural-log logsumexp of the "
                 "scaled logits, float32) and do; float32 math, outputs in q.dtype."),
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    large_logit_inputs_fn=large_logit_inputs,
    solution_path=Path(__file__).with_name("solution.py"),
)
