"""block_sparse_attention: causal attention restricted to the (query block, key block) pairs a
block layout turns on, as block-sparse attention layers and FlexAttention's BlockMask do.

q, k, v are [B, H, S, D]; the sequence is cut into blocks of 128 tokens (nb = ceil(S / 128),
the last block partial when S is not a multiple). layout[L, nb, nb] int32 (L = H: one layout
per head; L = 1: one for all heads) says which pairs are computed: query i attends to key j iff
j <= i (causal) and layout[head, i // 128, j // 128] != 0. Then softmax(q @ k^T * D**-0.5) @ v
over those keys, the softmax in float32, output in q.dtype. Every layout keeps its diagonal
blocks (layout[:, n, n] == 1), so every query sees at least itself and no row is empty, and
holds only 0 and 1, none above the diagonal (those pairs are masked by causality anyway).
A kernel that visits only the on blocks does the density's share of the reference's work,
which computes every pair and masks.

Layouts, per case (`pattern`):
- strided: Phi-3-small's block-sparse layers (config: blocksparse_block_size 64,
  blocksparse_num_local_blocks 16, blocksparse_vert_stride 8, blocksparse_homo_head_pattern
  false; vLLM's get_sparse_attn_mask): key block j is on for query block i when i - j < local
  (the local window) or (j + head * step + 1) % stride == 0 (vertical columns, shifted per head
  by step = max(1, stride // heads) when the layout is per head). At this task's 128-token
  block the same token extents are local 8 (1024 tokens) and stride 4 (a column every 512
  tokens); check sizes shrink them so their few blocks are not all on.
- documents: packed pre-training sequences with attention kept inside each document (Llama 3's
  cross-document mask; FlexAttention's document mask), documents starting on 128-token block
  boundaries here; one layout for all heads; a document's first block sees only itself.
- random: per-head dynamic block selection in the manner of MInference's block-sparse heads: the
  diagonal, the first block (attention sink) and each other earlier block with probability p.

Shapes from the models' configs (num_attention_heads, head_dim, context):
- Phi-3-small-8k (its layers alternate dense and block-sparse, dense_attention_every_n_layers
  2): 32 query heads, head_dim 128, max_position_embeddings 8192; the train bench is one
  8192-token prefill on the 16 heads of one chip of two (tensor parallel), its strided
  per-head layout (21.6% of the block pairs on). All 32 heads would not fit the reference in a
  v5e's 16 GiB: libtpu's compile asks 26.5 GiB of temporaries at 32 heads, 5.1 GiB at 16.
- Llama-3-8B: 32 query heads, head_dim 128, 8192-token pre-training sequences with the
  cross-document mask; held out on 16 heads of a 6000-token sequence (not a block multiple).
Both models have 8 kv heads; k and v here are per query head, as after repeat_kv. Check sizes:
per-head strided layouts (train), one shared layout over a ragged sequence (train), head_dim 64
with random layouts and a documents layout (held out).
Shapes from: Phi-3-small, Llama-3-8B.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from tasks.references import HIGHEST, softmax_last_axis
from tasks.spec import ATTENTION_TOLERANCES, ArgSpec, Case, Stress, Task, case_grid, normal, np_dtype
from tasks.stresses import LARGE_LOGITS, logit_offset

_DTYPES = ("float32", "bfloat16")
BLOCK = 128  # tokens per layout block (FlexAttention's default BlockMask block; a TPU lane tile)
# q and k scaled so the logits have std ~2.25: the softmax is peaky (a few keys dominate each row),
# so outputs are O(0.1-1), not washed out by averaging many values of v.
_QK_SCALE = 1.5


def reference(q, k, v, layout):
    out_dtype = q.dtype
    seq = q.shape[2]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) * q.shape[-1] ** -0.5
    on = jnp.repeat(jnp.repeat(layout != 0, BLOCK, axis=1), BLOCK, axis=2)[:, :seq, :seq]  # [L, S, S]
    causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]
    s = jnp.where(on[None] & causal, s, -jnp.inf)  # the diagonal is always on: no empty row
    p = softmax_last_axis(s)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=HIGHEST).astype(out_dtype)


def n_blocks(case: Case) -> int:
    return -(-case.dims["s"] // BLOCK)


def layout_heads(case: Case) -> int:
    return 1 if case.params["shared"] else case.dims["h"]


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    nb = n_blocks(case)
    shape = (d["b"], d["h"], d["s"], d["d"])
    return [ArgSpec(shape, case.dtype)] * 3 + [ArgSpec((layout_heads(case), nb, nb), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """layout holds 0 and 1."""
    return [None, None, None, (0, 1)]


def draw_layout(case: Case, rng: np.random.Generator) -> np.ndarray:
    """The case's layout [L, nb, nb] int32 (module docstring), lower block-triangular with its
    diagonal on. strided: params local, stride (deterministic); documents: document lengths
    drawn uniformly in params doc_blocks = (lo, hi) blocks; random: each earlier block (other
    than block 0, always on) on with probability params p."""
    params = case.params
    heads, nb = layout_heads(case), n_blocks(case)
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    lower = j <= i
    kind = params["pattern"]
    if kind == "strided":
        local, stride = params["local"], params["stride"]
        step = max(1, stride // case.dims["h"]) if heads > 1 else 0
        on = [lower & ((i - j < local) | ((j + head * step + 1) % stride == 0)) for head in range(heads)]
    elif kind == "documents":
        lo, hi = params["doc_blocks"]
        doc = np.zeros(nb, np.int64)
        start, n = 0, 0
        while start < nb:
            length = int(rng.integers(lo, hi + 1))
            doc[start:start + length] = n
            start, n = start + length, n + 1
        on = [lower & (doc[:, None] == doc[None, :])] * heads
    elif kind == "random":
        on = [lower & ((rng.random((nb, nb)) < params["p"]) | (i == j) | (j == 0)) for _ in range(heads)]
    else:
        raise ValueError(f"{case.name}: unknown layout pattern {kind!r}")
    layout = np.stack(on).astype(np.int32)
    assert (layout[:, np.arange(nb), np.arange(nb)] == 1).all() and not (layout * ~lower).any()
    return layout


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q_spec, k_spec, v_spec, _ = arg_specs(case)
    return (normal(rng, q_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, k_spec.shape, case.dtype, scale=_QK_SCALE),
            normal(rng, v_spec.shape, case.dtype),
            draw_layout(case, rng))


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    q, k, v, layout = make_inputs(case, rng)
    q, k = logit_offset(q, k, rng)
    return q.astype(np_dtype(case.dtype)), k.astype(np_dtype(case.dtype)), v, layout


_PHI3_SMALL = dict(pattern="strided", shared=False, local=8, stride=4)  # at 128-token blocks

CASES = (
    # Train: per-head strided layouts over 16 blocks (local 3, a column every 4th block, shifted
    # per head), and one shared (homo-head) strided layout over a ragged 1100-token sequence
    # (9 blocks, the last 76 tokens long) in a batch of 2.
    case_grid("train", "check", [dict(b=1, h=2, s=2048, d=128)], _DTYPES,
              params=dict(pattern="strided", shared=False, local=3, stride=4))
    + case_grid("train", "check", [dict(b=2, h=2, s=1100, d=128)], _DTYPES,
                params=dict(pattern="strided", shared=True, local=2, stride=3))
    # Held-out: head_dim 64 with random per-head layouts over 12 blocks (the last partial); a
    # shared documents layout (documents of 1 to 3 blocks) over 6 blocks.
    + case_grid("heldout", "check", [dict(b=1, h=3, s=1500, d=64)], _DTYPES,
                params=dict(pattern="random", shared=False, p=0.3))
    + case_grid("heldout", "check", [dict(b=2, h=2, s=700, d=128)], _DTYPES,
                params=dict(pattern="documents", shared=True, doc_blocks=(1, 3)))
    # Phi-3-small: 16 of its 32 heads (one chip of two), an 8192-token prefill, per-head layout.
    + case_grid("train", "bench", [dict(b=1, h=16, s=8192, d=128)], _DTYPES, params=_PHI3_SMALL)
    # Llama-3-8B pre-training: 16 of 32 heads, a 6000-token sequence of documents of 512 to
    # 2048 tokens (4 to 16 blocks).
    + case_grid("heldout", "bench", [dict(b=1, h=16, s=6000, d=128)], _DTYPES,
                params=dict(pattern="documents", shared=True, doc_blocks=(4, 16)))
)

TASK = Task(
    name="block_sparse_attention",
    version=1,
    level=2,
    description=("Causal block-sparse attention: query i attends to key j <= i where "
                 "layout[head (or 0), i // 128, j // 128] != 0 (128-token blocks, diagonal blocks "
                 "always on); softmax(q @ k^T * head_dim**-0.5) @ v, softmax in float32; output in "
                 "q.dtype."),
    signature=("kernel(q[B, H, S, D], k[B, H, S, D], v[B, H, S, D], "
               "layout[H or 1, ceil(S / 128), ceil(S / 128)] int32) -> o[B, H, S, D]"),
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances=dict(ATTENTION_TOLERANCES),
    required_features=("scalar_prefetch",),
    # The reference computes every (query, key) pair and masks; a kernel needs only the on
    # blocks: 21.6% of the pairs at the train bench (Phi-3-small's layout), 9-18% at the
    # held-out bench (documents of 4 to 16 blocks: 12.8% on average, 9.0% the least of 200
    # draws), 19-33% at the check sizes.
    necessary_flops_share=0.08,
    stresses=(Stress("large_logits", LARGE_LOGITS, large_logit_inputs),),
)
