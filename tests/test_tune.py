"""The block-size tuner: it recovers a solution's blocks from a bad start, never picks a
setting the checks refuse, and keeps the source as written apart from its knobs."""
import pytest

from evaluator.candidate.knobs import find_knobs, rewrite
from evaluator.tune import static_trial, tune
from tasks import get_task

# A row softmax whose blocks past 64 rows are fast in the model and wrong when run.
WRONG_WHEN_LARGE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = 64

def _softmax(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    total = jnp.sum(e, axis=-1, keepdims=True)
    if BLOCK_ROWS > 64:
        total = total * 2.0
    o_ref[...] = (e / total).astype(o_ref.dtype)

def kernel(x):
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    rows = x2.shape[0]
    br = min(BLOCK_ROWS, rows)
    out = pl.pallas_call(_softmax, grid=(pl.cdiv(rows, br),),
                         in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
                         out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype))(x2)
    return out.reshape(x.shape)
'''


def _forced(task_name: str, value: int) -> str:
    source = get_task(task_name).solution_source()
    knobs = [k for k in find_knobs(source) if k.name.startswith("BLOCK")]
    assert knobs, f"{task_name}'s solution has no BLOCK_* knobs"
    return rewrite(source, knobs, {k.name: value for k in knobs})


def _recovers(evaluator, task_name: str) -> None:
    task = get_task(task_name)
    solution = static_trial(task, task.solution_source(), evaluator)
    result = tune(task, _forced(task_name, 128), evaluator)
    assert result.best.ok and result.best is not result.baseline
    assert result.best.slowdown <= 1.10 * solution.slowdown, (result.best, solution)
    assert result.baseline.slowdown > result.best.slowdown
    assert "correct on the" in result.verified
    # Settings whose blocks overflow VMEM were tried and refused, never chosen.
    assert any(t.status == "compile_error" for t in result.trials)
    assert result.best.vmem_bytes <= evaluator.generation.default_scoped_vmem_bytes or \
        "vmem_limit_bytes" in result.source


@pytest.mark.slow
def test_tune_recovers_matmul_blocks_from_128(evaluator):
    _recovers(evaluator, "matmul")


@pytest.mark.slow
@pytest.mark.parametrize("task_name", ["gemm_bias_gelu", "softmax_matmul"])
def test_tune_recovers_fused_gemm_blocks_from_128(evaluator, task_name):
    _recovers(evaluator, task_name)


def test_a_setting_that_fails_the_check_run_is_never_chosen(evaluator):
    result = tune(get_task("softmax"), WRONG_WHEN_LARGE, evaluator, budget_s=60)
    better = [t for t in result.trials if t.ok and t.key() < result.baseline.key()]
    assert better and all(t.setting["BLOCK_ROWS"] > 64 for t in better)  # the model prefers them
    assert result.rejected and all("wrong_output" in why for _, why in result.rejected)
    assert result.best.setting["BLOCK_ROWS"] <= 64 and "correct on the" in result.verified
    assert result.source == rewrite(WRONG_WHEN_LARGE, result.knobs, result.best.setting)
