"""Correct kernels written in styles unlike the reference solutions are graded correct."""
import pytest

from tests.conftest import HONEST, sampled

KERNELS = [
    ("matmul_other_grid_order", "matmul"),      # grid (N, M, K), accumulate in the output block
    ("matmul_manual_dma", "matmul"),            # pl.ANY operands, make_async_copy + semaphores
    ("matmul_emit_pipeline", "matmul"),         # grid-less kernel running pltpu.emit_pipeline
    ("matmul_custom_vjp", "matmul"),            # custom_vjp wrapper, K loop over ref slices
    ("matmul_single_buffered", "matmul"),       # pl.Buffered(1) operands
    ("softmax_ragged_rows", "softmax"),         # cdiv grid with a ragged last block
    ("softmax_two_kernels", "softmax"),         # two pallas_calls in sequence
    ("rms_norm_rank1_scale", "rms_norm"),       # rank-1 block, `//` in index maps
    ("grouped_matmul_group_grid", "grouped_matmul"),  # scalar prefetch, grid over groups
    ("attention_causal_whole_kv", "attention_fwd_causal"),  # no online softmax, whole K/V
    ("mlp_unfused", "transformer_mlp_fwd"),     # 3 kernels, [M, F] f32 hidden in HBM, gelu in XLA
]


# The default suite's sample (docs/testing.md, "Tiers"): manual DMAs into pl.ANY operands, and a
# program of two kernels; `-m slow` grades the other styles.
@pytest.mark.parametrize("name,task", sampled(KERNELS, {"matmul_manual_dma", "softmax_two_kernels"},
                                              ids=lambda k: k[0]))
def test_honest_kernel_is_correct_on_all_splits(evaluator, name, task):
    verdict = evaluator.grade(task, (HONEST / f"{name}.py").read_text(), split="all")
    assert verdict.status == "correct", verdict.message
    assert {c.split for c in verdict.cases} == {"train", "heldout"}
    assert all(c.status == "correct" for c in verdict.cases)
