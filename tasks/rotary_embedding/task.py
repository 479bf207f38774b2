"""rotary_embedding: RoPE (rotate-half convention, base 10000) of q and k [B, S, H, D].

Position of row s is s (0..S-1); frequency i (0 <= i < D/2) is base^(-2i/D); with
x1 = x[..., :D/2], x2 = x[..., D/2:]:  out = x * cos + concat(-x2, x1) * sin, where cos and sin
of angle position * frequency are repeated over both halves. Returns (q_rot, k_rot).

The train bench's h=32, d=128, s=4096 are Llama-2-7B's num_attention_heads, head size
(4096 / 32) and max_position_embeddings; base 10000 is its rope_theta.
Shapes from: Llama-2-7B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.spec import ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")
BASE = 10000.0


def _rope(x):
    s, d = x.shape[1], x.shape[3]
    inv_freq = 1.0 / (BASE ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))   # [D/2]
    angle = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]     # [S, D/2]
    cos = jnp.concatenate([jnp.cos(angle)] * 2, axis=-1)[None, :, None, :]    # [1, S, 1, D]
    sin = jnp.concatenate([jnp.sin(angle)] * 2, axis=-1)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def reference(q, k):
    return (_rope(q.astype(jnp.float32)).astype(q.dtype),
            _rope(k.astype(jnp.float32)).astype(k.dtype))


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    shape = (d["b"], d["s"], d["h"], d["d"])
    return [ArgSpec(shape, case.dtype), ArgSpec(shape, case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec = arg_specs(case)
    return normal(rng, q_spec.shape, case.dtype), normal(rng, k_spec.shape, case.dtype)


CASES = (
    case_grid("train", "check", [dict(b=2, s=512, h=2, d=128), dict(b=2, s=180, h=4, d=128)],
              _DTYPES)
    # Held-out shapes differ in kind: head_dim 64 with H*D = 192 (not a multiple of 128) and a
    # sequence with a ragged last block; head_dim 256 with a short sequence and batch 3.
    + case_grid("heldout", "check", [dict(b=1, s=300, h=3, d=64), dict(b=3, s=40, h=2, d=256)],
                _DTYPES)
    + case_grid("train", "bench", [dict(b=4, s=4096, h=32, d=128)], _DTYPES)
    + case_grid("heldout", "bench", [dict(b=1, s=8192, h=12, d=64)], _DTYPES)
)

TASK = Task(
    name="rotary_embedding",
    version=2,
    level=2,
    description=("Rotary position embedding of q and k (rotate-half convention, base 10000, "
                 "positions 0..S-1), cos/sin computed in float32; outputs in the input dtype."),
    signature="kernel(q[B, S, H, D], k[B, S, H, D]) -> (q_rot[B, S, H, D], k_rot[B, S, H, D])",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
)
