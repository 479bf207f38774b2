"""decoder_layer: one Llama-style decoder layer forward over a batch of sequences.

    h   = x + attn(rms_norm(x) * g1)
    out = h + mlp(rms_norm(h) * g2)

rms_norm(y) = y * rsqrt(mean(y^2, -1) + 1e-5) (Llama's rms_norm_eps). attn is causal
grouped-query attention: with xn = rms_norm(x) * g1, q = xn @ wq, k = xn @ wk, v = xn @ wv split
into heads of head_dim dh (column h * dh + j of a projection is feature j of head h); rotary
embeddings on q and k (not v), in the rotate-half convention of Llama's Hugging Face code,
rope(t) = t * cos + concat(-t[dh/2:], t[:dh/2]) * sin, with the tables cos, sin [s, dh] given as
inputs, as a model computes them once from the positions and hands them to every layer; query
head h attends with kv head h // (hq // hkv) (consecutive query heads share a kv head, Llama's
repeat_kv) to keys j <= i, softmax(q k^T * dh**-0.5) v; the heads, concatenated in head order,
go through wo. mlp is SwiGLU, (silu(y @ w_gate) * (y @ w_up)) @ w_down. Everything in float32
(softmax and norms included); output in x.dtype.

The tables are float32 in both dtypes: row p holds cos and sin of p * theta^(-2i/dh) for
i < dh/2, repeated over both halves, with Llama-3's rope_theta 500000 and positions 0..s-1 (a
prefill). Llama-3.1/3.2's long-context rescaling of the frequencies changes only the tables'
values, which a kernel reads and never recomputes.

A case gives g, the query heads per kv head, and hkv (hq = g * hkv), so every size the grader
derives from a case is a valid layout.

Shapes from the models' configs (hidden_size, num_attention_heads, num_key_value_heads,
head_dim, intermediate_size, rms_norm_eps, rope_theta):
- Llama-3-8B: 4096, 32, 8, 128 (hidden_size / heads), 14336, 1e-5, 500000. The train bench is
  one 4096-token prefill (b 1, s 4096): libtpu's compile of the reference for v5e needs 3.1 GiB
  of its 16 GiB (the weights 0.9 GiB in float32, one [32, 4096, 4096] float32 copy of the logits
  2 GiB).
- Llama-3.2-1B: 2048, 32, 8, 64, 8192, 1e-5, 500000 (held out: head_dim 64, two 3000-token
  prefills, not a multiple of any block).
Check sizes are small widths over sequences of several 512-row blocks: the ragged train case
runs three (s 1100, the last partial) with 2 query heads per kv head, the other train case two
sequences of 640 with Llama's 4; held out, head_dim 64 at an off-tile width (d 320) over 1300
positions, and one kv head shared by 6 query heads with an off-tile intermediate size (f 700).
Shapes from: Llama-3-8B, Llama-3.2-1B.
"""
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.references import HIGHEST, attention_reference
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Task, case_grid, normal
from tasks.stresses import small_scale

_DTYPES = ("float32", "bfloat16")
EPS = 1e-5
ROPE_THETA = 500000.0
# q and k projections scaled so q and k have std ~1.5 and the logits ~2.25 (as the attention
# tasks draw them): peaky softmax rows, outputs O(0.1-1) rather than an average washed out.
_QK_SCALE = 1.5


def _rms_norm(y, g):
    return y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + EPS) * g


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    rotated = jnp.concatenate([-t[..., half:], t[..., :half]], axis=-1)
    return t * cos[:, None, :] + rotated * sin[:, None, :]


def reference(x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down):
    out_dtype = x.dtype
    x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down = (
        a.astype(jnp.float32) for a in (x, cos, sin, g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down))
    b, s, _ = x.shape
    dh = cos.shape[-1]
    hq, hkv = wq.shape[1] // dh, wk.shape[1] // dh
    xn = _rms_norm(x, g1)
    q = _rope(jnp.dot(xn, wq, precision=HIGHEST).reshape(b, s, hq, dh), cos, sin)
    k = _rope(jnp.dot(xn, wk, precision=HIGHEST).reshape(b, s, hkv, dh), cos, sin)
    v = jnp.dot(xn, wv, precision=HIGHEST).reshape(b, s, hkv, dh)
    k, v = (jnp.repeat(t, hq // hkv, axis=2) for t in (k, v))  # query head h -> kv head h // g
    o = attention_reference(*(t.transpose(0, 2, 1, 3) for t in (q, k, v)), causal=True)
    h = x + jnp.dot(o.transpose(0, 2, 1, 3).reshape(b, s, hq * dh), wo, precision=HIGHEST)
    hn = _rms_norm(h, g2)
    gated = jax.nn.silu(jnp.dot(hn, w_gate, precision=HIGHEST)) * jnp.dot(hn, w_up, precision=HIGHEST)
    return (h + jnp.dot(gated, w_down, precision=HIGHEST)).astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    n = case.dims
    b, s, hkv, g, dh, d, f = (n[k] for k in ("b", "s", "hkv", "g", "dh", "d", "f"))
    if dh % 2:
        raise ValueError(f"{case.name}: head_dim dh={dh} must be even (rotate-half RoPE)")
    dt = case.dtype
    return [ArgSpec((b, s, d), dt), ArgSpec((s, dh), "float32"), ArgSpec((s, dh), "float32"),
            ArgSpec((d,), dt), ArgSpec((d, g * hkv * dh), dt), ArgSpec((d, hkv * dh), dt),
            ArgSpec((d, hkv * dh), dt), ArgSpec((g * hkv * dh, d), dt), ArgSpec((d,), dt),
            ArgSpec((d, f), dt), ArgSpec((d, f), dt), ArgSpec((f, d), dt)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def rope_tables(s: int, dh: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [s, dh] float32 for positions 0..s-1, each frequency repeated over both halves."""
    inv_freq = ROPE_THETA ** (-np.arange(0, dh, 2, dtype=np.float64) / dh)   # [dh/2]
    angle = np.arange(s, dtype=np.float64)[:, None] * inv_freq[None, :]      # [s, dh/2]
    angle = np.concatenate([angle, angle], axis=-1)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """x with a non-zero mean and std 0.5 (a kernel that skips a norm sees half-size rows);
    norm gains 1 + 0.3 N(0, 1), far from all-ones; wq and wk scaled to q, k of std 1.5, wv to v
    of std 1, wo by (hq dh)**-0.5, w_gate and w_up by d**-0.5 (pre-activations O(1), silu in its
    curved region), w_down by f**-0.5: the attention and MLP branches are each about as large
    as the residual, so dropping or breaking either shows."""
    specs = arg_specs(case)
    d, f, dh = case.dims["d"], case.dims["f"], case.dims["dh"]
    hq_dh = specs[4].shape[1]
    dt = case.dtype
    cos, sin = rope_tables(case.dims["s"], dh)
    return (normal(rng, specs[0].shape, dt, scale=0.5, shift=0.1), cos, sin,
            normal(rng, (d,), dt, scale=0.3, shift=1.0),
            normal(rng, specs[4].shape, dt, scale=_QK_SCALE * d ** -0.5),
            normal(rng, specs[5].shape, dt, scale=_QK_SCALE * d ** -0.5),
            normal(rng, specs[6].shape, dt, scale=d ** -0.5),
            normal(rng, specs[7].shape, dt, scale=hq_dh ** -0.5),
            normal(rng, (d,), dt, scale=0.3, shift=1.0),
            normal(rng, specs[9].shape, dt, scale=d ** -0.5),
            normal(rng, specs[10].shape, dt, scale=d ** -0.5),
            normal(rng, specs[11].shape, dt, scale=f ** -0.5))


def fit_case(case: Case) -> Case:
    """A derived size keeps head_dim even (rotate-half splits it in two)."""
    dh = case.dims["dh"]
    return case if dh % 2 == 0 else dataclasses.replace(case, dims={**case.dims, "dh": dh + 1})


CASES = (
    # Train: three 512-row sequence blocks, the last partial (s = 1100, off the 8-row tile),
    # 2 query heads per kv head; two sequences of 640 with Llama's 4 per kv head.
    case_grid("train", "check", [dict(b=1, s=1100, hkv=2, g=2, dh=128, d=256, f=512),
                                 dict(b=2, s=640, hkv=2, g=4, dh=128, d=384, f=768)], _DTYPES)
    # Held-out shapes differ in kind: Llama-3.2-1B's head_dim 64 with a width off the 128-lane
    # tile and a ragged sequence; one kv head shared by 6 query heads, an intermediate size off
    # the 128-lane tile, three sequences.
    + case_grid("heldout", "check", [dict(b=1, s=1300, hkv=2, g=4, dh=64, d=320, f=640),
                                     dict(b=3, s=200, hkv=1, g=6, dh=128, d=256, f=700)], _DTYPES)
    # Llama-3-8B: one 4096-token prefill.
    + case_grid("train", "bench", [dict(b=1, s=4096, hkv=8, g=4, dh=128, d=4096, f=14336)], _DTYPES)
    # Llama-3.2-1B: two 3000-token prefills.
    + case_grid("heldout", "bench", [dict(b=2, s=3000, hkv=8, g=4, dh=64, d=2048, f=8192)], _DTYPES)
)

TASK = Task(
    name="decoder_layer",
    version=1,
    level=3,
    description=("One Llama decoder layer: h = x + attn(rms_norm(x) * g1), out = h + "
                 "swiglu_mlp(rms_norm(h) * g2), rms eps 1e-5; attn is causal grouped-query attention "
                 "(query head h uses kv head h // (hq // hkv)) with rotate-half RoPE on q and k from "
                 "the cos/sin tables, scale head_dim**-0.5; float32 math, output in x.dtype."),
    signature=("kernel(x[b, s, d], cos[s, dh] float32, sin[s, dh] float32, g1[d], wq[d, hq*dh], "
               "wk[d, hkv*dh], wv[d, hkv*dh], wo[hq*dh, d], g2[d], w_gate[d, f], w_up[d, f], "
               "w_down[f, d]) -> [b, s, d]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    # Attention's bound: at default precision the TPU multiplies the f32 operands of every
    # projection and of q k^T as bf16, and the peaky softmax turns that into a relative L2 error
    # of 5.7e-3..6.7e-3 for the solution (f32, 7 seeds; bf16 cases 5.3e-3..6.0e-3), over the
    # MXU bound of 6e-3.
    tolerances=dict(ATTENTION_TOLERANCES),
    # The reference computes every logit; a kernel needs only the causal half (s(s+1)/2 of s^2).
    # Attention's two matmuls, 4 b hq s^2 dh FLOPs, are 13.3% of the reference's at the train
    # bench (275 of 2065 GFLOP) and 16.7% at the held-out bench (148 of 881 GFLOP); a kernel
    # that skips the masked triangle does 1 - 0.5 x 13.3% = 93.3% and 91.6% of them. 0.9 sits
    # just under both.
    necessary_flops_share=0.9,
    fit_case=fit_case,
    stresses=(small_scale(make_inputs, which=(0,)),),
)
