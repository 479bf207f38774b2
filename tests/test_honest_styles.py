"""Correct kernels written in styles unlike the reference solutions are graded correct."""
import pytest

from tests.conftest import HONEST

KERNELS = [
    ("matmul_other_grid_order", "matmul"),
    ("matmul_manual_dma", "matmul"),
    ("softmax_ragged_rows", "softmax"),
    ("rms_norm_rank1_scale", "rms_norm"),
]


@pytest.mark.parametrize("name,task", KERNELS, ids=[k[0] for k in KERNELS])
def test_honest_kernel_is_correct_on_all_splits(evaluator, name, task):
    verdict = evaluator.grade(task, (HONEST / f"{name}.py").read_text(), split="all")
    assert verdict.status == "correct", verdict.message
    assert {c.split for c in verdict.cases} == {"train", "heldout"}
    assert all(c.status == "correct" for c in verdict.cases)
