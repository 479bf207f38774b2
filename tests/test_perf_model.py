"""The static performance model on kernels whose HBM traffic is known by hand."""
import jax
import jax.numpy as jnp
import pytest

from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.analysis.jaxpr_cost import Cost
from evaluator.candidate.knobs import find_knobs, rewrite
from evaluator.performance.hardware import F32_MATMUL_SHARE, GENERATIONS, GRID_STEP_S
from evaluator.performance.perf_model import estimate, kernel_estimate
from evaluator.truth.reference import ReferenceCache
from tasks import get_task
from tests.conftest import HONEST

MiB = 1 << 20
N = 4096
SPECS = [jax.ShapeDtypeStruct((N, N), jnp.float32)] * 2


def _summary(source: str):
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    return summarize(jax.make_jaxpr(namespace["kernel"])(*SPECS), traffic=True)


def _matmul_with_blocks(size: int) -> str:
    """The matmul solution with every block (BLOCK_M, BLOCK_N, BLOCK_K) set to `size`."""
    source = get_task("matmul").solution_source()
    knobs = find_knobs(source)
    return rewrite(source, knobs, {k.name: size for k in knobs})


def _matmul_case():
    task = get_task("matmul")
    return task, next(c for c in task.select("train", "bench") if c.dtype == "float32")


def test_block_refetches_are_counted_like_the_pallas_pipeline():
    # 512 tiles, grid (i, j, k) with k innermost: x and y blocks change every step
    # (8^3 = 512 fetches of 1 MiB each), the output block once per (i, j) (64 x 1 MiB).
    (call,) = _summary(_matmul_with_blocks(512)).pallas_calls
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
    reference = Cost(flops=flops, matmul_flops=flops)
    good = estimate(case.name, _summary(_matmul_with_blocks(512)), GENERATIONS[gen], reference, args, outs)
    bad = estimate(case.name, _summary((HONEST / "matmul_other_grid_order.py").read_text()),
                   GENERATIONS[gen], reference, args, outs)
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


_COPY_SOURCE = '''
import jax
from jax.experimental import pallas as pl

ROWS = {rows}

def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

def kernel(x, y):
    return pl.pallas_call(_copy, grid=(x.shape[0] // ROWS,),
                          in_specs=[pl.BlockSpec((ROWS, x.shape[1]), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((ROWS, x.shape[1]), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


def test_each_grid_step_costs_a_fixed_time():
    # Same bytes and FLOPs; 8-row blocks take 512 steps, 512-row blocks 8.
    gen = GENERATIONS["v5e"]
    (small,) = _summary(_COPY_SOURCE.format(rows=8)).pallas_calls
    (large,) = _summary(_COPY_SOURCE.format(rows=512)).pallas_calls
    small_est, large_est = kernel_estimate(small, gen), kernel_estimate(large, gen)
    assert small_est.hbm_bytes == large_est.hbm_bytes == 2 * N * N * 4
    assert small_est.time_s - large_est.time_s == pytest.approx((512 - 8) * GRID_STEP_S)


_WHOLE_MATMUL_SOURCE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _mm(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

def kernel(x, y):
    return pl.pallas_call(_mm, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
'''


def test_a_kernels_dots_at_highest_precision_carry_their_extra_mxu_passes():
    """HIGHEST multiplies f32 operands in 6 bf16 passes, in a kernel as in XLA (a v5e ran
    attention backward's f32 HIGHEST kernel 3.9x slower than its bf16 one): the estimate
    carries the 5 extra passes to the speed prediction, beside its FLOPs."""
    highest = _WHOLE_MATMUL_SOURCE.replace("preferred_element_type=jnp.float32",
                                           "preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST")
    (plain,), (call,) = _summary(_WHOLE_MATMUL_SOURCE).pallas_calls, _summary(highest).pallas_calls
    assert plain.multipass_flops == 0 and call.flops == plain.flops
    assert call.multipass_flops == pytest.approx(5 * 2.0 * N ** 3)
    assert kernel_estimate(call, GENERATIONS["v5e"]).multipass_flops == call.multipass_flops


def _attention_head_summary(head_dim: int):
    """One grid step of q.k^T then p.v over 256 tokens at a head of `head_dim`."""
    source = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _attend(q_ref, k_ref, v_ref, o_ref):
    s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())))
    o_ref[...] = jnp.dot(s, v_ref[...])

def kernel(q, k, v):
    return pl.pallas_call(_attend, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype))(q, k, v)
'''
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    spec = jax.ShapeDtypeStruct((256, head_dim), jnp.bfloat16)
    (call,) = summarize(jax.make_jaxpr(namespace["kernel"])(spec, spec, spec), traffic=True).pallas_calls
    return call


def test_a_narrow_head_pays_for_the_mxu_tiles_it_leaves_empty():
    """The MXU holds a dot's rhs in 128-wide tiles: at a 64-wide head, q.k^T contracts over half
    a tile and p.v fills half of its output lanes, so each takes the MXU the time of a 128-wide
    head's (a v5e ran jax's flash attention at 3000 tokens x 64 twice as slow as the 64-wide
    FLOPs predicted). The estimate carries that padding to the speed prediction; a 128-wide head
    has none."""
    narrow, wide = _attention_head_summary(64), _attention_head_summary(128)
    assert wide.mxu_padding_flops == 0
    assert narrow.flops == pytest.approx(2 * 2.0 * 256 * 256 * 64)
    assert narrow.mxu_padding_flops == pytest.approx(narrow.flops)
    assert kernel_estimate(narrow, GENERATIONS["v5e"]).mxu_padding_flops == narrow.mxu_padding_flops


def test_f32_matmuls_run_at_the_f32_rate_and_the_ideal_follows_the_case_dtype():
    gen = GENERATIONS["v5e"]
    task, case = _matmul_case()
    summary = _summary(_WHOLE_MATMUL_SOURCE)  # one step, each operand moved once: compute-bound
    (call,) = summary.pallas_calls
    assert call.f32_matmul_flops == pytest.approx(2.0 * N ** 3)
    reference = ReferenceCache().cost(task, case)
    assert reference.matmul_flops == pytest.approx(2.0 * N ** 3)
    est = estimate(case.name, summary, gen, reference, list(task.arg_specs(case)),
                   list(task.out_specs(case)))
    assert est.bound == "compute"
    assert est.time_s == pytest.approx(call.flops / gen.f32_matmul_flops_per_s
                                       + call.grid_steps * GRID_STEP_S, rel=0.02)
    # The f32 case's ideal does its matmuls at the f32 rate; the floor (for the cheat rule)
    # at the bf16 peak, which no kernel doing the work can beat.
    assert est.ideal_time_s == pytest.approx(2.0 * N ** 3 / gen.f32_matmul_flops_per_s)
    assert est.floor_time_s == pytest.approx(est.ideal_time_s * F32_MATMUL_SHARE)
    bf16 = next(c for c in task.select("train", "bench") if c.dtype == "bfloat16")
    bf16_est = estimate(bf16.name, summary, gen, reference, list(task.arg_specs(bf16)),
                        list(task.out_specs(bf16)))
    assert bf16_est.ideal_time_s == bf16_est.floor_time_s


def test_causal_tasks_need_only_half_the_reference_flops():
    """A causal kernel that skips the masked half (a triangular grid) is honest: the floor the
    grader holds estimates to, and the share of work it asks kernels to do, follow
    Task.necessary_flops_share instead of the reference's full S x S logits."""
    from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
    from evaluator.stages import _missing_work

    task = get_task("attention_fwd_causal")
    assert task.necessary_flops_share == 0.5 and get_task("attention_fwd").necessary_flops_share == 1.0
    case = next(c for c in task.select("train", "bench") if c.dtype == "bfloat16")
    reference = ReferenceCache().cost(task, case)
    triangular = TraceSummary([PallasCallInfo("flash", [1], [], [], 0, None, None, [],
                                              flops_per_step=0.52 * reference.flops)],
                              Cost(), [])
    assert _missing_work(triangular, reference.flops * task.necessary_flops_share, case) is None
    assert _missing_work(triangular, reference.flops, case) is not None
    args, outs = list(task.arg_specs(case)), list(task.out_specs(case))
    full = estimate(case.name, triangular, GENERATIONS["v5e"], reference, args, outs)
    half = estimate(case.name, triangular, GENERATIONS["v5e"], reference, args, outs,
                    task.necessary_flops_share)
    assert half.floor_time_s == pytest.approx(0.5 * full.floor_time_s)  # compute-bound
    assert half.time_s / half.floor_time_s >= 0.8 > full.time_s / full.floor_time_s


_PREFETCH_SOURCE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

def _scale(n_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * n_ref[0].astype(jnp.float32)

def kernel(x, y):
    n = jnp.ones((1,), jnp.int32)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(x.shape[0] // 512, x.shape[1] // 512),
        in_specs=[pl.BlockSpec((512, 512), lambda i, j, n_ref: ({row}, j))],
        out_specs=pl.BlockSpec((512, 512), lambda i, j, n_ref: (i, j)))
    return pl.pallas_call(_scale, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(n, x)
'''


def test_index_maps_that_ignore_prefetched_scalars_are_counted_exactly():
    # With scalar prefetch every index map receives the prefetched refs: only one that reads
    # them is data-dependent (charged a fetch per step).
    (plain,) = _summary(_PREFETCH_SOURCE.format(row="i")).pallas_calls
    assert [b.fetches for b in plain.blocks] == [64, 64]
    (reads,) = _summary(_PREFETCH_SOURCE.format(row="i * n_ref[0]")).pallas_calls
    assert [b.fetches for b in reads.blocks] == [None, 64]
