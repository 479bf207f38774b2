"""Honest kernels pass on every seed, with room to spare (benchmarks/seed_stability.py).

The default suite checks one solution on 3 seeds; `-m slow` nine more, on 5 seeds under CI=true
(the whole margin table is the benchmark's job: python benchmarks/seed_stability.py).
"""
import importlib.util
import sys

import pytest

from tests.conftest import IN_CI, TESTS, sampled

MARGIN = 0.7  # an honest kernel's worst error stays below this share of its bound
TASKS = ["matmul", "attention_fwd", "geglu", "ragged_attention", "gemm_softmax", "swiglu_mlp",
         "paged_attention", "attention_bwd", "layer_norm", "softmax"]


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "seed_stability", TESTS.parent / "benchmarks" / "seed_stability.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task", sampled(TASKS, {"matmul"}))
def test_solution_verdicts_do_not_flip_with_the_seed(task):
    bench = _benchmark()
    kernels = bench.honest_kernels(["solutions"], [task])
    margins = bench.measure(kernels, n_seeds=5 if IN_CI else 3, workers=1, base_seed=7,
                            tpu_numerics=True)
    for m in margins:
        assert not m.failed_cases, f"{m.kernel} ({m.dtype}): {m.failed_cases}"
        assert m.worst_ratio < MARGIN, f"{m.kernel} ({m.dtype}) reached {m.worst_ratio:.2f} of its bound"


def test_a_dtype_keeps_only_its_cases_in_every_corpus():
    """`--dtype float32` measures a family's f32 bound: bf16 cases, and kernels expected correct
    on bf16 alone (jax's flash backward), are left out."""
    bench = _benchmark()
    kernels = bench.honest_kernels(["solutions", "honest", "thirdparty"], ["matmul", "attention_bwd"],
                                   ["float32"])
    labels = {label for label, *_ in kernels}
    assert {"matmul/solution", "honest/matmul_manual_dma", "thirdparty/jax_matmul"} <= labels
    assert "thirdparty/jax_flash_bwd" not in labels
    assert all(c.dtype == "float32" for _, task, _, _ in kernels for c in task.cases)
