"""Structure analysis, feature detectors and the VMEM budget model on real traced kernels."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from evaluator.analysis.features import check_feature
from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.analysis.jaxpr_cost import total_flops
from evaluator.candidate.knobs import find_knobs, rewrite
from evaluator.performance.hardware import GENERATIONS, MiB, buffers, tiled_bytes, vmem_budget, vmem_lower_bound
from tasks import get_task
from tests.conftest import HONEST, read_candidate


def _trace(source: str, *specs):
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    return summarize(jax.make_jaxpr(namespace["kernel"])(*specs))


def _specs(task_name, case_index=0):
    task = get_task(task_name)
    case = task.select("train", "check")[case_index]
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in task.arg_specs(case)]


def test_reference_flops_count_the_matmul():
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    y = jax.ShapeDtypeStruct((32, 16), jnp.float32)
    assert total_flops(jax.make_jaxpr(jnp.dot)(x, y)) == 2 * 64 * 32 * 16


def test_solution_has_kernels_and_no_outside_work():
    summary = _trace(get_task("matmul").solution_source(), *_specs("matmul"))
    assert len(summary.pallas_calls) == 1
    assert summary.outside.flops == 0 and not summary.outside.heavy_ops


def test_outside_work_is_found():
    summary = _trace(read_candidate("work_outside_row_max"), *_specs("softmax"))
    assert summary.outside.flops > 0 and "reduce_max" in summary.outside.top_ops
    summary = _trace(read_candidate("work_outside_dot"), *_specs("matmul"))
    assert summary.outside.heavy_ops == ["dot_general"]
    summary = _trace(read_candidate("work_outside_pure_callback"), *_specs("softmax"))
    assert summary.outside.callbacks == ["pure_callback"]


def missing_features(required, calls, task):
    """The required features the kernels doing the case's work do not use (the features stage's rule)."""
    inputs = get_task(task).arg_specs(get_task(task).select("train", "check")[0])
    return [name for name in required if check_feature(name, calls, False, inputs)[1] is not None]


def test_feature_detectors_on_real_kernels():
    gmm = _trace(get_task("grouped_matmul").solution_source(), *_specs("grouped_matmul"))
    # one "arbitrary" column axis: its work list streams rows by manual DMA
    assert missing_features(("scalar_prefetch", "vmem_scratch", "manual_dma", "parallel_grid"),
                            gmm.pallas_calls, "grouped_matmul") == ["parallel_grid"]
    mm = _trace(get_task("matmul").solution_source(), *_specs("matmul"))
    assert missing_features(("parallel_grid", "vmem_scratch"), mm.pallas_calls, "matmul") == []
    dma = _trace((HONEST / "matmul_manual_dma.py").read_text(), *_specs("matmul"))
    assert missing_features(("manual_dma",), dma.pallas_calls, "matmul") == []
    assert missing_features(("scalar_prefetch",), dma.pallas_calls, "matmul") == ["scalar_prefetch"]
    plain = _trace(read_candidate("work_outside_zeros"), *_specs("matmul"))
    assert missing_features(("manual_dma", "vmem_scratch", "parallel_grid"), plain.pallas_calls, "matmul") == [
        "manual_dma", "vmem_scratch", "parallel_grid"]


def test_vmem_lower_bound_counts_double_buffers_tiles_and_scratch():
    source = get_task("matmul").solution_source()
    knobs = find_knobs(source)
    summary = _trace(rewrite(source, knobs, {k.name: 512 for k in knobs}),
                     jax.ShapeDtypeStruct((4096, 4096), jnp.float32),
                     jax.ShapeDtypeStruct((4096, 4096), jnp.float32))
    (call,) = summary.pallas_calls
    # three 512x512 f32 blocks, double-buffered, plus one 512x512 f32 accumulator
    assert vmem_lower_bound(call) == 3 * 2 * 512 * 512 * 4 + 512 * 512 * 4
    assert tiled_bytes([7, 100], "float32") == 8 * 128 * 4
    assert tiled_bytes([12, 100], "bfloat16") == 16 * 128 * 2
    # the kernel's own vmem_limit_bytes, else the generation's default scoped limit
    assert call.vmem_limit_bytes == 64 * MiB and vmem_budget(call, GENERATIONS["v5e"])[0] == 64 * MiB
    default = dataclasses.replace(call, vmem_limit_bytes=None)
    assert vmem_budget(default, GENERATIONS["v5e"])[0] == 16 * MiB
    assert vmem_budget(default, GENERATIONS["v6e"])[0] == 32 * MiB


def test_few_rows_pad_to_a_power_of_two_not_to_a_whole_tile():
    """What libtpu's v5e compile allocated for VMEM scratch of few rows (CompileTimeScopedVmemOom's
    "Scoped allocation with size"): rows pad to a power of two, at least one packed sublane's
    (two bf16 rows), not to the native 8 (f32) or 16 (bf16). tpu-inference's ragged paged
    attention keeps (2, 2048, 17, 1, 128) f32 of KV scratch, 34 MiB, which an 8-row pad made
    272 MiB: refused as over VMEM where it compiled and ran on a v5e."""
    allocated = {((131072, 1, 128), "float32"): 64 * MiB, ((43690, 3, 128), "float32"): 85.33 * MiB,
                 ((26214, 5, 128), "float32"): 102.4 * MiB, ((131072, 1, 128), "bfloat16"): 64 * MiB,
                 ((43690, 3, 128), "bfloat16"): 42.67 * MiB, ((26214, 5, 128), "bfloat16"): 51.2 * MiB}
    for (shape, dtype), size in allocated.items():
        assert tiled_bytes(list(shape), dtype) == pytest.approx(size, rel=1e-3), (shape, dtype)
    assert tiled_bytes([2, 2048, 17, 1, 128], "float32") == 2 * 2048 * 17 * 128 * 4


def test_whole_array_blocks_overflow_vmem_only_at_bench_size():
    source = read_candidate("compile_error_vmem_overflow")
    small = _trace(source, *_specs("matmul")).pallas_calls[0]
    big = _trace(source, jax.ShapeDtypeStruct((4096, 4096), jnp.float32),
                 jax.ShapeDtypeStruct((4096, 4096), jnp.float32)).pallas_calls[0]
    limit = GENERATIONS["v5e"].default_scoped_vmem_bytes
    assert vmem_lower_bound(small) < limit < vmem_lower_bound(big)


def test_single_step_grids_are_single_buffered():
    """libtpu compiled a grid-less 14 MiB matmul for v5e (16 MiB limit); double-counting would
    have rejected it."""
    source = read_candidate("compile_error_vmem_overflow")
    (call,) = _trace(source, jax.ShapeDtypeStruct((1024, 1280), jnp.float32),
                     jax.ShapeDtypeStruct((1280, 1024), jnp.float32)).pallas_calls
    assert vmem_lower_bound(call) == (1024 * 1280 + 1280 * 1024 + 1024 * 1024) * 4
    assert vmem_lower_bound(call) < GENERATIONS["v5e"].default_scoped_vmem_bytes


def test_lane_narrow_blocks_are_not_counted_as_padded_pipeline_buffers():
    """Padded to 128 lanes, this router's (7168, 8) and (7168, 2) blocks would count 21 MiB,
    over v5e's 16 MiB; libtpu compiles it (tests/test_tpu_compile.py), as it compiles
    JAXBench's level 2 18 with an (8192, 1) block. Wide blocks still count in full."""
    task = get_task("moe_router_topk")
    (case,) = [c for c in task.select("train", "bench") if c.dtype == "float32"]
    (call,) = _trace(read_candidate("narrow_blocks_router"),
                     *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in task.arg_specs(case)]).pallas_calls
    padded = sum(buffers(call, b) * tiled_bytes(b.block_shape, b.dtype) for b in call.blocks)
    limit = GENERATIONS["v5e"].default_scoped_vmem_bytes
    assert padded == 21 * MiB > limit and vmem_lower_bound(call) == 0
    (wide,) = _trace(read_candidate("compile_error_vmem_overflow"), jax.ShapeDtypeStruct((4096, 4096), jnp.float32),
                     jax.ShapeDtypeStruct((4096, 4096), jnp.float32)).pallas_calls
    assert vmem_lower_bound(wide) > limit
