"""The static performance model on kernels whose HBM traffic is known by hand."""
import jax
import jax.numpy as jnp
import pytest

from evaluator.hardware import GENERATIONS
from evaluator.jaxpr_analysis import summarize
from evaluator.perf_model import estimate, kernel_estimate
from tasks import get_task
from tests.conftest import HONEST

MiB = 1 << 20
N = 4096
SPECS = [jax.ShapeDtypeStruct((N, N), jnp.float32)] * 2


def _summary(source: str):
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    return summarize(jax.make_jaxpr(namespace["kernel"])(*SPECS), traffic=True)


def _matmul_case():
    task = get_task("matmul")
    return task, next(c for c in task.select("train", "bench") if c.dtype == "float32")


def test_block_refetches_are_counted_like_the_pallas_pipeline():
    # 512 tiles, grid (i, j, k) with k innermost: x and y blocks change every step
    # (8^3 = 512 fetches of 1 MiB each), the output block once per (i, j) (64 x 1 MiB).
    (call,) = _summary(get_task("matmul").solution_source()).pallas_calls
    assert [b.fetches for b in call.blocks] == [512, 512, 64]
    assert kernel_estimate(call, GENERATIONS["v5e"]).hbm_bytes == (512 + 512 + 64) * MiB
    # 128 tiles: every operand re-read 32 times, the f32 output written once per tile.
    (small,) = _summary((HONEST / "matmul_other_grid_order.py").read_text()).pallas_calls
    assert kernel_estimate(small, GENERATIONS["v5e"]).hbm_bytes == (2048 + 2048 + 64) * MiB


def test_manual_dma_traffic_is_counted():
    (call,) = _summary((HONEST / "matmul_manual_dma.py").read_text()).pallas_calls
    # 32 x 32 output tiles, each streaming 32 (128 x 128) f32 tiles of x and of y
    assert call.dma_bytes_per_step == 32 * 2 * 128 * 128 * 4
    assert kernel_estimate(call, GENERATIONS["v5e"]).hbm_bytes == (4096 + 64) * MiB


@pytest.mark.parametrize("gen", ["v5e", "v6e"])
def test_needless_refetch_scores_worse_and_ideal_is_the_floor(gen):
    task, case = _matmul_case()
    args, outs, flops = list(task.arg_specs(case)), list(task.out_specs(case)), 2.0 * N ** 3
    good = estimate(case.name, _summary(task.solution_source()), GENERATIONS[gen], flops, args, outs)
    bad = estimate(case.name, _summary((HONEST / "matmul_other_grid_order.py").read_text()),
                   GENERATIONS[gen], flops, args, outs)
    assert good.ideal_bytes == 3 * N * N * 4
    assert good.slowdown_vs_ideal >= 1.0  # the ideal kernel is the floor
    assert good.slowdown_vs_ideal < bad.slowdown_vs_ideal
    assert good.hbm_bytes < bad.hbm_bytes and good.time_s < bad.time_s
    assert good.flops == pytest.approx(flops, rel=0.02)


def test_estimate_is_in_the_verdict(evaluator):
    verdict = evaluator.grade("matmul", get_task("matmul").solution_source(), split="train")
    assert verdict.status == "correct"
    model = verdict.details["perf_model"]
    assert set(model) == {c.name for c in get_task("matmul").select("train", "bench")}
    assert "ideal kernel" in verdict.details["perf_estimate"]
