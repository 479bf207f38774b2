"""Stage 8's logic (timing, and the output check at the timed sizes) against a stand-in
timing backend: interpret mode on the CPU, so what a TPU will do is proven here first.

The stand-in times the replayed program in interpret mode; the figures mean nothing, the
flow does: same inputs for kernel and reference, outputs of the timed runs compared with the
reference at that size, speedup only for a kernel that is right there.
"""
from __future__ import annotations

import dataclasses

import pytest

from evaluator.execution.backends import get_backend
from evaluator.grader import Evaluator
from tasks import get_task
from tasks.spec import case_grid
from tests.conftest import PEER_FIXTURE

STAND_IN = dataclasses.replace(get_backend("tpu-interpret"), name="tpu-interpret+timing",
                               times_kernels=True)


def _small_bench_softmax():
    """softmax with bench sizes small enough to run in interpret mode."""
    task = get_task("softmax")
    cases = [c for c in task.cases if c.size == "check"]
    cases += case_grid("train", "bench", [dict(rows=64, d=384)], ("float32", "bfloat16"))
    return dataclasses.replace(task, cases=tuple(cases))


# Right at the check sizes; at 64 rows (only the timed size) every value is scaled by 1.05:
# enough arithmetic to pass the static work rules, wrong where only timing runs it.
WRONG_WHERE_TIMED = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def body(x_ref, o_ref, *, scale):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (scale * e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    import functools
    flat = x.reshape(-1, x.shape[-1])
    rows, d = flat.shape
    scale = 1.05 if rows == 64 else 1.0
    out = pl.pallas_call(
        functools.partial(body, scale=scale), grid=(pl.cdiv(rows, 8),),
        in_specs=[pl.BlockSpec((8, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, x.dtype))(flat)
    return out.reshape(x.shape)
'''


@pytest.fixture(scope="module")
def timing_evaluator():
    with Evaluator(backend="tpu-interpret", workers=1) as ev:
        ev.backend = STAND_IN
        yield ev


def test_a_correct_kernel_gets_a_speedup_from_its_timed_runs(timing_evaluator):
    task = _small_bench_softmax()
    verdict = timing_evaluator.grade(task, task.solution_source(), seed=4)
    assert verdict.status == "correct", verdict.message
    assert verdict.speedup is not None and verdict.speedup > 0
    bench = [c.name for c in task.select("train", "bench")]
    assert sorted(verdict.timings) == sorted(bench)
    for samples in verdict.timings.values():
        assert len(samples["kernel_s"]) == 20 and len(samples["reference_s"]) == 20
    assert "Speedup over XLA" in verdict.message


@pytest.mark.slow
def test_a_kernel_wrong_only_at_the_timed_size_gets_no_speedup(timing_evaluator):
    task = _small_bench_softmax()
    verdict = timing_evaluator.grade(task, WRONG_WHERE_TIMED, seed=4)
    assert verdict.status == "wrong_output", verdict.message
    assert verdict.stage == "timing" and "timed case" in verdict.message
    assert verdict.speedup is None
    assert all(c.status == "correct" for c in verdict.cases)  # every compared case passed


@pytest.mark.slow
def test_an_imported_task_is_timed_against_its_own_reference(timing_evaluator):
    """A peer suite's task: the worker builds their reference with our driver (suites/driver.py
    timed_reference) and times it beside the kernel, at a bench case here as small as a check case."""
    from suites.resolver import TaskResolver

    fixture = PEER_FIXTURE
    with TaskResolver([f"jaxbench:{fixture}"]) as resolver:
        task = resolver.task("kernelbench-jax/level1/23_Softmax")
        check = task.select("train", "check")[0]
        bench = dataclasses.replace(check, name=f"{check.name}_timed", size="bench")
        task.external.sources[bench.name] = task.external.sources[check.name]
        task.external.described[bench.name] = task.external.described[check.name]
        small = dataclasses.replace(task, cases=(*(c for c in task.cases if c.size == "check"), bench))
        answer = fixture / "pallas_eval" / "generated" / "alpha" / "jaxkernelbench_level1" / "23_Softmax.py"
        verdict = timing_evaluator.grade(small, answer.read_text(), seed=0)
    assert verdict.status == "correct", verdict.message
    assert list(verdict.timings) == [bench.name] and verdict.speedup is not None
