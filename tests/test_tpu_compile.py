"""tpu-compile: a full libtpu compile for a named TPU generation, on a machine with no TPU.

Needs the optional extra (pip install -e '.[tpu-compile]'); skipped without libtpu (failed in CI).
"""
import time

import pytest

from evaluator.execution.backends import get_backend
from evaluator.execution.protocol import Compile, Done, Failed, Load, Reset, Trace, Traced
from evaluator.execution.sandbox import Limits, Worker
from evaluator.grader import Evaluator
from evaluator.performance.hardware import GENERATIONS
from evaluator.stages import case_spec
from tasks import all_tasks
from tests.conftest import read_candidate, require_module

require_module("libtpu", "pip install -e '.[tpu-compile]'")
pytestmark = pytest.mark.tpu_compile


@pytest.fixture(scope="module")
def compile_evaluator():
    with Evaluator(backend="tpu-compile", generation="v5e") as ev:
        yield ev


def test_layout_failure_only_a_real_compile_catches(evaluator, compile_evaluator):
    source = read_candidate("compile_error_layout_reshape")
    assert evaluator.grade("softmax", source).status == "correct"
    verdict = compile_evaluator.grade("softmax", source)
    assert verdict.status == "compile_error", verdict.message
    assert "unsupported shape cast" in verdict.message


@pytest.mark.slow
def test_vmem_exhaustion_by_in_kernel_values(evaluator, compile_evaluator):
    source = read_candidate("compile_error_vmem_temporaries")
    assert evaluator.grade("attention_fwd", source).status == "correct"
    verdict = compile_evaluator.grade("attention_fwd", source)
    assert verdict.status == "compile_error", verdict.message
    assert "vmem" in verdict.message.lower() and "train_bench" in verdict.message


def test_declared_vmem_over_the_chip_is_rejected_fast(compile_evaluator):
    # whole 4096x4096 blocks: the VMEM model refuses it before libtpu spends minutes on it
    start = time.monotonic()
    verdict = compile_evaluator.grade("matmul", read_candidate("compile_error_vmem_overflow"))
    assert verdict.status == "compile_error" and time.monotonic() - start < 60


def test_lane_narrow_blocks_compile_beyond_their_padded_count_and_cover_cases_compile_too(compile_evaluator):
    """The router with 8192-token blocks: padded to 128 lanes they count 24 MiB at the train
    bench, over v5e's 16 MiB, and libtpu compiles both bench cases (so the VMEM bound must not
    count them: `lane_narrow`); at the derived coverage case (20480 tokens, a partial last block)
    it rejects the kernel, as a v5e did when it ran that case (runtime_error there)."""
    source = read_candidate("narrow_blocks_router").replace("ROWS = 7168", "ROWS = 8192")
    verdict = compile_evaluator.grade("moe_router_topk", source)
    assert verdict.status == "compile_error", verdict.message
    assert "the TPU compiler for v5e rejected case train_cover_t20480" in verdict.message
    assert {"train_bench_t32768_e8_f32", "train_bench_t32768_e8_bf16"} <= set(verdict.details["compiled_memory"])


@pytest.mark.slow
def test_correct_kernel_records_compiler_memory_stats(compile_evaluator):
    from tasks import get_task

    verdict = compile_evaluator.grade("matmul", get_task("matmul").solution_source())
    assert verdict.status == "correct", verdict.message
    stats = verdict.details["compiled_memory"]["train_bench_m4096_k4096_n4096_f32"]
    assert stats["argument_size_in_bytes"] == 2 * 4096 * 4096 * 4


@pytest.fixture(scope="module")
def compile_worker():
    """One tpu-compile worker per test process for the sweep below: each task's test is one
    item, so `pytest -m slow --dist load` spreads the sweep over both processes."""
    worker = Worker(get_backend("tpu-compile"), Limits(step_timeout_s=120))
    yield worker
    worker.kill()


@pytest.mark.slow
@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.name)
@pytest.mark.parametrize("gen", ["v5e", "v6e"])
def test_every_solution_compiles(compile_worker, gen, task):
    """Compile each task's solution for the generation at its bench sizes, where VMEM budgets
    and tiling bite (check sizes use the same code on smaller blocks); no interpret runs."""
    try:
        loaded, _ = compile_worker.call(Load(task.solution_source(), GENERATIONS[gen].device_kind))
        assert isinstance(loaded, Done), loaded
        bench = task.select("all", "bench")  # compiled from the program traced here
        traced, _ = compile_worker.call(Trace([case_spec(task, c) for c in bench]))
        assert isinstance(traced, Traced), traced
        failures = []
        for case in bench:
            reply, _ = compile_worker.call(Compile(GENERATIONS[gen].topology, case_spec(task, case)), timeout_s=300)
            if isinstance(reply, Failed):
                failures.append(f"{case.name}: {reply.error}")
        assert not failures, "\n".join(failures)
    finally:
        compile_worker.call(Reset())
