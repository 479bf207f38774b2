"""cross_entropy_bwd: gradient of the mean softmax cross-entropy with respect to the logits.

loss = mean_i [logsumexp(logits_i) - logits_i[labels_i]] over the M rows of logits[M, V], so

    dlogits[i, j] = (softmax(logits_i)[j] - (j == labels_i)) / M

computed in float32, output in logits.dtype. Rows are independent: a kernel takes the row max
and the sum of exp(logit - max) over the vocabulary (whole rows in VMEM, or an online max and
sum over vocabulary tiles), then writes the row once more.

Vocabulary sizes from real models: the train bench is the 32000-token vocabulary of Llama-2-7B
and Mistral-7B over 4096 tokens (one 4096-token sequence, Llama-2's context); the held-out bench
is GPT-2's 50257 (no multiple of 128: the lanes of the last vocabulary tile are ragged) over 2048
tokens, and Qwen2's 151936 over 1024 tokens (a float32 row is 594 KiB: few rows fit a block).
151936 is the vocab_size of Qwen2-0.5B and Qwen2-1.5B (Qwen2-7B's is 152064).
Shapes from: Llama-2-7B, Mistral-7B, GPT-2, Qwen2-1.5B.
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tasks.spec import DEFAULT_TOLERANCES, ArgSpec, Case, Stress, Task, Tolerance, case_grid, np_dtype

_DTYPES = ("float32", "bfloat16")


def reference(logits, labels):
    m, v = logits.shape
    p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    onehot = (labels[:, None] == jnp.arange(v, dtype=jnp.int32)[None, :]).astype(jnp.float32)
    return ((p - onehot) / m).astype(logits.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    m, v = case.dims["m"], case.dims["v"]
    return [ArgSpec((m, v), case.dtype), ArgSpec((m,), "int32")]


def out_specs(case: Case) -> list[ArgSpec]:
    return [ArgSpec((case.dims["m"], case.dims["v"]), case.dtype)]


def int_bounds(case: Case) -> list[tuple[int, int] | None]:
    """Labels index the vocabulary."""
    return [None, (0, case.dims["v"] - 1)]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Logits 2 * N(0, 1) plus a per-row offset in [-3, 3] (a language model's logits spread over
    # a few units): softmax puts visible mass on many columns, so dropping the softmax, the
    # one-hot or the 1/M, or a one-hot one column off, is far outside the bound. Labels uniform
    # over the vocabulary, so they land in every vocabulary tile, the ragged last one included.
    m, v = case.dims["m"], case.dims["v"]
    logits = rng.standard_normal((m, v), dtype=np.float32) * 2.0
    logits += rng.uniform(-3.0, 3.0, size=(m, 1)).astype(np.float32)
    labels = rng.integers(0, v, size=m).astype(np.int32)
    return logits.astype(np_dtype(case.dtype)), labels


def large_logit_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The task's logits with every row moved by 80 to 120, up or down at random (the gradient
    does not change): models without logit soft-capping reach such logits. Up, exp overflows
    float32 unless the row max is taken out first; down, exp(logit) underflows to zero, so a
    running max seeded with 0 rather than -inf or the first value leaves 0 / 0."""
    logits, labels = make_inputs(case, rng)
    rows = (logits.shape[0], 1)
    offset = rng.uniform(80.0, 120.0, size=rows) * rng.choice([-1.0, 1.0], size=rows)
    return (logits.astype(np.float32) + offset.astype(np.float32)).astype(logits.dtype), labels


CASES = (
    # Several row blocks each; the second is off the (8, 128) tile in rows and in vocabulary
    # lanes (a ragged last row block and a vocabulary no multiple of 128).
    case_grid("train", "check", [dict(m=512, v=2048), dict(m=260, v=3000)], _DTYPES)
    # Held-out shapes differ in kind: another unaligned vocabulary with a ragged last row block,
    # a single row (the mean is over one row) with a long vocabulary.
    + case_grid("heldout", "check", [dict(m=150, v=1000), dict(m=1, v=12000)], _DTYPES)
    # Llama-2-7B / Mistral-7B vocabulary, one 4096-token sequence.
    + case_grid("train", "bench", [dict(m=4096, v=32000)], _DTYPES)
    # GPT-2's unaligned vocabulary over 2048 tokens; Qwen2's 151936 over 1024 tokens.
    + case_grid("heldout", "bench", [dict(m=2048, v=50257), dict(m=1024, v=151936)], _DTYPES)
)

# The output's L2 norm is almost all in the one-hot entries (p - 1) / M, which bf16 holds nearly
# exactly (-1/M itself for M a power of two, -1 + p for the single row), so the default float32
# bound (relative L2 5e-4) let the reference rounded to bf16 through on three of the four float32
# check shapes (rel_l2 down to 6e-5..4.6e-4 over 6 seeds). Element-wise it cannot hide: rounding
# to bf16 moves an element by up to 2**-9 of itself, and with rtol 1e-3 (atol only 1e-5 of the
# output's rms) 8-18% of the elements of every check case fail (8 seeds). Honest float32 kernels,
# emulated in numpy over 8 seeds, reach at most 0.25 of this bound: a reciprocal 2.5e-4 off (an
# approximate one) 0.25, exp summed in another order 0.0035, p / M - 1 / M at the label (what
# this solution writes) 5e-4.
_TOL_F32 = Tolerance(atol=1e-5, rtol=1e-3, rel_l2=5e-4)

TASK = Task(
    name="cross_entropy_bwd",
    version=1,
    level=2,
    description=("Gradient of the mean softmax cross-entropy over M rows with respect to the "
                 "logits, (softmax(logits) - onehot(labels)) / M, computed in float32; output in "
                 "logits.dtype."),
    signature="kernel(logits[M, V], labels[M] int32) -> dlogits[M, V]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    int_bounds=int_bounds,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    tolerances={"float32": _TOL_F32, "bfloat16": DEFAULT_TOLERANCES["bfloat16"]},
    stresses=(Stress("large_logits", "logits offset by 80 to 120 per row, up or down, where exp "
                     "overflows or underflows float32 without the row max", large_logit_inputs),),
)
