"""Required features must be used, not only declared (evaluator/analysis/features.py): a token use of
each is refused with missing_feature, and the verdict carries the evidence."""
import dataclasses

import pytest

from tasks import get_task
from tests.conftest import HONEST, TESTS

TOKENS = TESTS / "token_features"


def _requiring(task_name: str, feature: str):
    """A task that requires `feature` on top of its own (the detector is what is tested)."""
    task = get_task(task_name)
    return dataclasses.replace(task, required_features=(*task.required_features, feature))


CASES = [
    # (task, token kernel, feature, what the refusal says)
    (get_task("matmul_int8_scaled"), "vmem_scratch_untouched", "vmem_scratch", "is never written"),
    (get_task("batched_matmul"), "parallel_grid_one_step", "parallel_grid", "have one step each"),
    (_requiring("matmul", "manual_dma"), "manual_dma_tiny_copy", "manual_dma", "never reach an output"),
    (_requiring("matmul", "scalar_prefetch"), "scalar_prefetch_unread", "scalar_prefetch",
     "no index map reads and the body never uses"),
]


@pytest.mark.parametrize("task,token,feature,why", CASES, ids=[c[2] for c in CASES])
def test_a_token_use_is_refused_with_the_evidence(evaluator, task, token, feature, why):
    verdict = evaluator.grade(task, (TOKENS / f"{token}.py").read_text(), seed=0)
    assert verdict.status == "missing_feature", verdict.message
    assert f"requires {feature}" in verdict.message and why in verdict.message
    assert "To use it," in verdict.message
    evidence = verdict.details["features"][feature]
    assert evidence and all(isinstance(facts, list) for facts in evidence.values())


def test_real_uses_pass_the_features_stage(evaluator):
    """Declared and used: the manual-DMA matmul copies every byte of its HBM operands; a
    prefetched scalar read by an index map chooses the block."""
    dma = evaluator.grade(_requiring("matmul", "manual_dma"), (HONEST / "matmul_manual_dma.py").read_text(),
                          seed=0, through="features")
    assert dma.status == "pending", dma.message
    bench = [facts for case, facts in dma.details["features"]["manual_dma"].items() if "bench" in case]
    assert bench and all(f[0]["dma_bytes"] >= 0.5 * f[0]["any_operand_bytes"] > 0 for f in bench)
    read = (TOKENS / "scalar_prefetch_unread.py").read_text().replace(
        "lambda i, j, s: (i, 0)", "lambda i, j, s: (i + s[0], 0)")
    prefetch = evaluator.grade(_requiring("matmul", "scalar_prefetch"), read, seed=0, through="features")
    assert prefetch.status == "pending", prefetch.message
    facts = next(iter(prefetch.details["features"]["scalar_prefetch"].values()))[0]
    assert facts["index_maps_reading_them"] == [0]


def test_dmas_that_feed_an_output_must_also_move_the_operands_bytes():
    """A copy whose destination is read and reaches an output is a use; at bench sizes it must
    also move at least half of the bytes left outside the pipeline (MIN_DMA_SHARE)."""
    from evaluator.analysis.features import _manual_dma
    from evaluator.analysis.jaxpr_analysis import BlockInfo, PallasCallInfo
    from evaluator.analysis.kernel_dataflow import RefUse

    hbm = BlockInfo("in", [1024, 1024], [1024, 1024], "float32", "any", 1)
    feeding = [RefUse(written=True, read=True, reaches_output=True)]

    def call(dma_bytes: float, uses: list) -> PallasCallInfo:
        return PallasCallInfo("k", [4], [hbm], [], 0, None, None, ["dma_start", "dma_wait"],
                              dma_bytes_per_step=dma_bytes, dma_use=uses)

    assert _manual_dma(call(1024 * 1024, feeding), bench=True).used           # 4 MiB of 4 MiB
    tiny = _manual_dma(call(8 * 128 * 4, feeding), bench=True)
    assert not tiny.used and "of its ANY operands" in tiny.why_not
    unread = _manual_dma(call(1024 * 1024, [RefUse(written=True)]), bench=False)
    assert not unread.used and "never reach an output" in unread.why_not


def test_every_solution_with_required_features_shows_its_use(evaluator):
    for task in [t for t in map(get_task, ("fused_cross_entropy", "grouped_matmul", "paged_attention",
                                            "batched_matmul"))]:
        verdict = evaluator.grade(task, task.solution_source(), seed=0, through="features")
        assert verdict.status == "pending", f"{task.name}: {verdict.message}"
        assert set(verdict.details["features"]) == set(task.required_features)


ALIASED = "{1: 0, 3: 1, 4: 2} if exact else {}"  # adamw_step's solution: param, m, v in place


def test_aliasing_the_large_buffers_is_a_use_and_aliasing_a_small_one_is_not(evaluator):
    """adamw_step's solution writes param', m' and v' over param, m and v. Always aliased (its
    solution gives up aliasing where interpret mode cannot run it, which the features stage
    does not reach) it uses input_output_aliases; aliasing m alone, a third of the large inputs'
    bytes, leaves param and v copied and is refused at the bench sizes."""
    task = _requiring("adamw_step", "input_output_aliases")
    source = task.solution_source()
    assert ALIASED in source
    whole = evaluator.grade(task, source.replace(ALIASED, "{1: 0, 3: 1, 4: 2}"), seed=0, through="features")
    assert whole.status == "pending", whole.message
    bench = [facts[0] for case, facts in whole.details["features"]["input_output_aliases"].items() if "bench" in case]
    assert bench and all(f["aliased_bytes"] >= 0.5 * f["large_input_bytes"] > 0 for f in bench)
    small = evaluator.grade(task, source.replace(ALIASED, "{3: 1}"), seed=0, through="features")
    assert small.status == "missing_feature", small.message
    assert "requires input_output_aliases" in small.message and "of the task's large inputs" in small.message


def test_a_kernel_without_aliases_does_not_use_them():
    from evaluator.analysis.features import _input_output_aliases
    from evaluator.analysis.jaxpr_analysis import BlockInfo, PallasCallInfo

    cache = BlockInfo("in", [64, 16, 8, 128], [1, 16, 8, 128], "bfloat16", "vmem", 2)
    call = PallasCallInfo("k", [4], [cache, cache], [], 0, None, None, [])
    none = _input_output_aliases(call, bench=False)
    assert not none.used and "aliases no output to an input" in none.why_not
    call.aliases = [(0, 0)]
    assert _input_output_aliases(call, bench=True, large_bytes=2.0 * 64 * 16 * 8 * 128).used
