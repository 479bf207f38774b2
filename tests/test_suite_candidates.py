"""Model-written files in JAXBench's generated format (pallas_eval/generated/): graded as they are.

Each generated file rewrites the problem file whole: a `Model` whose forward calls pallas_call
(nesting its own `def kernel`), the problem's get_inputs kept, sometimes a bias kept as (1, N)
for a BlockSpec; Gemini 3's raw answers are prose with fences, some cut off mid-code. Written
here in that format (never copied from their checkout).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evaluator.candidate.extract import ExtractionError, extract_code
from evaluator.execution.program import with_tpu_dots
from evaluator.truth.compare import compare

TASK = "kernelbench-jax/level2/12_Gemm_Multiply_LeakyReLU"

# The problem file rewritten whole, as JAXBench's generated files are: the weights' layout its
# own (a (1, N) bias), the kernel nested in forward.
GENERATED = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


class Model:
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros((1, out_features))
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def set_weights(self, weights_dict):
        for name, value in weights_dict.items():
            setattr(self, name, jnp.array(value).reshape(1, -1) if name == "bias" else jnp.array(value))

    def forward(self, x):
        mult, slope = self.multiplier, self.negative_slope

        def kernel(x_ref, w_ref, b_ref, o_ref):
            y = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32) + b_ref[...]
            y = y * mult
            o_ref[...] = jnp.where(y >= 0, y, y * slope).astype(o_ref.dtype)

        m, k = x.shape
        n = self.weight.shape[1]
        bm, bn = 128, 128
        return pl.pallas_call(
            kernel,
            grid=(m // bm, n // bn),
            in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                      pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                      pl.BlockSpec((1, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        )(x, self.weight, self.bias)


batch_size = 1024
in_features = 8192
out_features = 8192
multiplier = 2.0
negative_slope = 0.1


def get_inputs():
    key = jax.random.PRNGKey(0)
    return [jax.random.uniform(key, shape=(batch_size, in_features))]


def get_init_inputs():
    return [in_features, out_features, multiplier, negative_slope]
'''


# --- extraction: whole modules, fenced or not; truncated answers ---------------------------------
def test_a_whole_module_defining_model_is_the_candidate_fenced_or_not():
    entry_points = ("ModelNew", "Model")
    assert extract_code(GENERATED, entry_points) == GENERATED
    fenced = f"Here is the kernel.\n\n```python\n{GENERATED}```\n\nIt tiles M and N by 128."
    assert extract_code(fenced, entry_points) == GENERATED
    # A nested `def kernel` (inside forward) is not an entry point: without Model nothing is.
    nested_only = "def outer():\n    def kernel(x):\n        return x\n    return kernel\n"
    with pytest.raises(ExtractionError, match="defines no ModelNew or Model"):
        extract_code(nested_only, entry_points)
    with pytest.raises(ExtractionError, match="contains no code"):
        extract_code("I would tile the matmul by 128.", entry_points)


def test_an_answer_cut_off_inside_its_code_is_a_truncated_answer():
    truncated = ("Let me think about the blocks. A (256, 8192) block is 8 MB...\n\n```python\n"
                 + GENERATED[:GENERATED.index("bm, bn")])
    with pytest.raises(ExtractionError, match="truncated"):
        extract_code(truncated, ("ModelNew", "Model"))
    # An earlier complete snippet is not what the answer meant to submit.
    with pytest.raises(ExtractionError, match="truncated"):
        extract_code("```python\nx = 1\n```\nNow the kernel:\n" + truncated, ("ModelNew", "Model"))
    # A closed block of another language after the code is no truncation.
    assert extract_code(f"```python\n{GENERATED}```\n```text\nok\n```\n", ("ModelNew", "Model")) == GENERATED


# --- grading: their format, their layout ----------------------------------------------------------
@pytest.mark.slow
def test_a_generated_file_is_graded_as_it_is(suite, v6e):
    verdict = v6e.grade(suite.task(TASK), GENERATED, seed=0)
    assert verdict.status == "correct", verdict.message
    adapted = ", ".join(verdict.details["adapted"])
    assert "dropped" in adapted and "builds your Model" in adapted


def test_a_truncated_generated_answer_gets_extraction_error(suite, v6e):
    answer = "I'll tile the GEMM.\n```python\n" + GENERATED[:400]
    verdict = v6e.grade(suite.task(TASK), answer, seed=0)
    assert verdict.status == "extraction_error" and "truncated" in verdict.message


def test_a_weight_in_another_layout_is_an_error_that_names_it(suite, v6e):
    transposed = GENERATED.replace("self.weight = jnp.zeros((in_features, out_features))",
                                   "self.weight = jnp.zeros((out_features, 2 * in_features))")
    verdict = v6e.grade(suite.task(TASK), transposed, seed=0)
    assert verdict.status != "correct"
    assert "weight 'weight'" in verdict.message and "layouts must agree" in verdict.message, verdict.message


# --- tolerance: the bound follows the computation ------------------------------------------------
def _relu_gemm(x, w):
    return jax.nn.relu(1.5 * (x @ w - 2.0))


def test_tpu_rounding_of_the_reference_widens_only_where_the_dots_round():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    w = (rng.standard_normal((1024, 256)) / 8).astype(np.float32)
    exact = np.asarray(jax.jit(_relu_gemm)(x, w))
    rounded = np.asarray(jax.jit(with_tpu_dots(_relu_gemm))(x, w))
    assert np.any(rounded != exact)
    # A kernel whose dot rounds as the TPU's does: its output is the rounded reference.
    kernel_out = np.asarray(jax.jit(_relu_gemm)(x.astype(jnp.bfloat16).astype(np.float32),
                                                w.astype(jnp.bfloat16).astype(np.float32)))
    from tasks.spec import Tolerance
    tight = Tolerance(atol=1e-6, rtol=1e-6, rel_l2=1e-2)
    assert not compare(kernel_out, exact, tight).ok  # judged against the output's scale only
    assert compare(kernel_out, exact, tight, rounded).ok
    # A wrong kernel still fails, slack or not.
    assert not compare(exact * 1.05, exact, tight, rounded).ok
    assert not compare(np.zeros_like(exact), exact, tight, rounded).ok


def _gated_ragged(x, w_gate, w_up, sizes):
    gate = jax.lax.ragged_dot(x, w_gate, sizes, preferred_element_type=jnp.float32)
    return jax.nn.silu(gate) * jax.lax.ragged_dot(x, w_up, sizes, preferred_element_type=jnp.float32)


def test_tpu_rounding_covers_ragged_dots():
    """lax.ragged_dot runs on the MXU as any dot does: a grouped kernel whose dots round as the
    TPU's is judged against the reference rounded the same way."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    w_gate, w_up = ((rng.standard_normal((3, 256, 128)) / 16).astype(np.float32) for _ in range(2))
    sizes = np.array([40, 0, 56], np.int32)
    exact = np.asarray(jax.jit(_gated_ragged)(x, w_gate, w_up, sizes))
    rounded = np.asarray(jax.jit(with_tpu_dots(_gated_ragged))(x, w_gate, w_up, sizes))
    as_bf16 = [a.astype(jnp.bfloat16).astype(np.float32) for a in (x, w_gate, w_up)]
    kernel_out = np.asarray(jax.jit(_gated_ragged)(*as_bf16, sizes))
    np.testing.assert_allclose(rounded, kernel_out, rtol=1e-5, atol=1e-5)
    assert np.any(rounded != exact)
