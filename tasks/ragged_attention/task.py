"""ragged_attention: variable-length multi-head attention over a padded batch, no causal mask.

Batch row b holds a sequence of lengths[b] tokens (1 <= lengths[b] <= S) padded to S. Query i of
row b attends to keys j < lengths[b] with softmax(q @ k^T * head_dim**-0.5); output rows
i >= lengths[b] are zero. The padding positions of q, k and v hold random values, not zeros, so
a kernel must mask them rather than rely on them.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
# As in attention_fwd: q and k scaled so the softmax rows are peaky and outputs are O(0.1-1).
_QK_SCALE = 1.5
_BLOCK = 128  # the smallest lane-aligned kv block; lengths are drawn to straddle its multiples


def reference(q, k, v, lengths):
    """Plain-jnp masked attention in float32; output in q.dtype, zero on padded query rows."""
    out_dtype = q.dtype
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    seq = q.shape[2]
    valid = jnp.arange(seq)[None, :] < lengths[:, None]  # [b, s]: position < length
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=lax.Precision.HIGHEST) * q.shape[-1] ** -0.5
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)  # every row keeps key 0: no NaN
    s = s - jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s)
    p = e / jnp.sum(e, axis=-1, keepdims=True)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=lax.Precision.HIGHEST)
    o = jnp.where(valid[:, None, :, None], o, 0.0)
    return o.astype(out_dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    x = ArgSpec((d["b"], d["h"], d["s"], d["d"]), case.dtype)
    return [x, x, x, ArgSpec((d["b"],), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def draw_lengths(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Seeded lengths in [1, s], from the case's `lengths` distribution, in random batch order.

    Both distributions include a length in (s/2, s) that is not a multiple of the 128 block
    (its last block is partly padding). Then:
    spread: one length in [2, s/2] (whole trailing q and kv blocks are padding once s >= 256),
      the rest uniform in [1, s].
    edge: one length 1 (a single key and a single real output row); with b >= 3 one length s
      (no padding), the rest uniform in [1, s].
    """
    b, s = case.dims["b"], case.dims["s"]
    kind = case.params["lengths"]
    if b < 2 or s < 4:
        raise ValueError(f"{case.name}: ragged lengths need a batch of at least 2 and s >= 4")
    partial = int(rng.integers(s // 2 + 1, s))
    partial -= partial % _BLOCK == 0  # never a block multiple
    if kind == "spread":
        lengths = [partial, int(rng.integers(2, s // 2 + 1))]
    elif kind == "edge":
        lengths = [partial, 1] + ([s] if b >= 3 else [])
    else:
        raise ValueError(f"{case.name}: unknown length distribution {kind!r}")
    lengths += list(rng.integers(1, s + 1, size=b - len(lengths)))
    lengths = rng.permutation(np.array(lengths, np.int32))
    assert ((lengths >= 1) & (lengths <= s)).all()
    return lengths


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """lengths in [1, s]."""
    return [None, None, None, (1, case.dims["s"])]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, _ = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            draw_lengths(case, rng))


# Check sizes keep the TPU-interpret grid at <= ~16 steps with 128-row blocks.
def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v, lengths = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v, lengths


def stale_padding_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The padding positions of k and v (past each length) 30 times larger than the live ones,
    as buffers reused from longer sequences hold: their logits dwarf the live ones', so a mask
    applied after exp (p * mask) meets exp of a huge logit, inf times 0."""
    q, k, v, lengths = make_inputs(case, rng)
    padded = (np.arange(case.dims["s"])[None, :] >= lengths[:, None])[:, None, :, None]  # [b, 1, s, 1]
    k = np.where(padded, k.astype(np.float32) * 30.0, k.astype(np.float32))
    v = np.where(padded, v.astype(np.float32) * 30.0, v.astype(np.float32))
    return q, k.astype(np_dtype(case.dtype)), v.astype(np_dtype(case.dtype)), lengths


CASES = (
    case_grid("train", "check", [dict(b=2, h=2, s=256, d=128), dict(b=2, h=1, s=180, d=128)], _DTYPES,
              params=dict(lengths="spread"))
    # Held-out cases differ in kind: lengths of 1 and of the full sequence, a sequence that is not
    # a multiple of 128 (the full length ends inside a block), head_dim 64, a longer sequence.
    + case_grid("heldout", "check", [dict(b=4, h=1, s=200, d=64), dict(b=2, h=1, s=384, d=128)],
                _DTYPES, params=dict(lengths="edge"))
    + case_grid("train", "bench", [dict(b=4, h=16, s=4096, d=128)], _DTYPES,
                params=dict(lengths="spread"))
    + case_grid("heldout", "bench", [dict(b=3, h=8, s=3000, d=64)], _DTYPES,
                params=dict(lengths="edge"))
)

TASK = Task(
    name="ragged_attention",
    version=2,
    level=3,
    description=("Variable-length multi-head attention over a padded batch: query i of row b "
                 "attends to keys j < lengths[b] with softmax(q @ k^T * head_dim**-0.5) @ v, "
                 "output rows i >= lengths[b] are zero; softmax in float32, output in q.dtype."),
    signature="kernel(q[B, H, S, D], k[B, H, S, D], v[B, H, S, D], lengths[B] int32) -> o[B, H, S, D]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    required_features=("scalar_prefetch",),
    heldout_task=True,
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),
              Stress("stale_padding", "keys and values past each length 30 times larger than the live ones",
                     stale_padding_inputs)),
)
