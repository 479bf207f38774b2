"""Arithmetic below the task's precision: int8/fp8 dots in float tasks are found and refused,
int8 tasks keep theirs (evaluator/analysis/precision.py), and f32 bounds sit below bf16 rounding."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.analysis.precision import float_inputs_only, low_precision_finding
from evaluator.truth.compare import compare
from evaluator.truth.reference import ReferenceCache
from tasks import all_tasks, get_task
from tasks.spec import DEFAULT_TOLERANCES
from tests.conftest import SAMPLE_TASKS, TESTS, sampled


def _module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(task_name, source_module, case_name=None):
    task = get_task(task_name)
    case = next(c for c in task.select("train", "check") if case_name is None or c.name == case_name)
    specs = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in task.arg_specs(case)]
    return task, case, summarize(jax.make_jaxpr(source_module.kernel)(*specs))


def test_int8_dots_in_a_float_task_are_found_and_named():
    cheat = _module(TESTS / "redteam" / "int8_chunked_matmul.py")
    task, case, summary = _summary("matmul", cheat)
    assert summary.pallas_calls[0].low_precision_dots == ["int8 x int8 -> int32"]
    message = low_precision_finding(summary.pallas_calls, [a.dtype for a in task.arg_specs(case)],
                                    case.name, task.name)
    assert message and "int8_chunk_kernel" in message and "int8 x int8 -> int32" in message


def test_int8_tasks_may_multiply_int8():
    task = get_task("matmul_int8_scaled")
    _, case, summary = _summary(task.name, _module(task.solution_path))
    assert any(call.low_precision_dots for call in summary.pallas_calls)  # the solution's own int8 dot
    assert low_precision_finding(summary.pallas_calls, [a.dtype for a in task.arg_specs(case)],
                                 case.name, task.name) is None


def test_honest_float_kernels_have_no_low_precision_dots():
    task = get_task("matmul")
    _, _, summary = _summary(task.name, _module(task.solution_path))
    assert all(not call.low_precision_dots for call in summary.pallas_calls)


@pytest.mark.parametrize("dtypes,expected", [
    (["float32", "float32"], True), (["bfloat16", "float32"], True),
    (["int8", "float32"], False), (["float32", "int8", "float32"], False), (["float32", "int32"], False)])
def test_float_inputs_only(dtypes, expected):
    assert float_inputs_only(dtypes) is expected


def test_tasks_with_int8_inputs_are_not_float_tasks():
    for name in ("matmul_int8_scaled", "dequant_matmul"):
        task = get_task(name)
        case = task.select("train", "check")[0]
        assert not float_inputs_only([a.dtype for a in task.arg_specs(case)])


VPU_F32 = [(t, c) for t in all_tasks() if t.tolerances.get("float32") == DEFAULT_TOLERANCES["float32"]
           for c in t.select("all", "check") if c.dtype == "float32"]


@pytest.mark.parametrize("task,case", sampled(VPU_F32, set(SAMPLE_TASKS) & {t.name for t, _ in VPU_F32},
                                              ids=lambda tc: f"{tc[0].name}-{tc[1].name}",
                                              key=lambda task, case: task.name))
def test_f32_outputs_rounded_to_bf16_fail_the_default_f32_bound(task, case):
    """f32 arithmetic outside the MXU is f32 on a TPU: a float output rounded to bf16 (the
    least a kernel computing in bf16 loses) is refused."""
    refs = ReferenceCache()
    inputs = refs.inputs(task, case, 0)
    outs = refs.outputs(task, case, inputs)
    floats = [(o, s) for o, s in zip(outs, task.out_specs(case)) if s.dtype == "float32" and o.size > 1]
    if not floats:
        pytest.skip("no float output to round")
    rounded = [compare(np.asarray(jnp.asarray(o).astype(jnp.bfloat16).astype(jnp.float32)), o,
                       task.tolerances["float32"]).ok for o, _ in floats]
    assert not all(rounded)
