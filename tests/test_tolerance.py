"""The comparison rejects what a lazy or cheating kernel returns, on every task's inputs."""
import numpy as np
import pytest

from evaluator.truth.compare import compare
from evaluator.truth.reference import ReferenceCache
from tasks import all_tasks
from tasks.spec import Tolerance, np_dtype
from tests.conftest import SAMPLE_TASKS, sampled

REFS = ReferenceCache()
CHECK_CASES = [(t, c) for t in all_tasks() for c in t.select("all", "check")]


def _reference(task, case, seed=0):
    inputs = REFS.inputs(task, case, seed)
    return inputs, REFS.outputs(task, case, inputs)


@pytest.mark.parametrize("task,case", sampled(CHECK_CASES, SAMPLE_TASKS, ids=lambda tc: f"{tc[0].name}-{tc[1].name}",
                                              key=lambda task, case: task.name))
def test_bad_outputs_fail_and_the_rounded_reference_passes(task, case):
    inputs, refs = _reference(task, case)
    tol = task.tolerances[case.dtype]
    for ref, spec in zip(refs, task.out_specs(case)):
        # The reference itself, rounded to the output dtype, passes.
        assert compare(ref.astype(np_dtype(spec.dtype)), ref, tol).ok
        assert not compare(np.zeros_like(ref), ref, tol).ok
        if ref.size == 1:  # a scalar (a mean loss): off by 1% must fail; nothing else applies
            assert not compare(ref * 1.01, ref, tol).ok
            continue
        # a constant (the mean) and noise of the right scale fail
        assert not compare(np.full_like(ref, ref.mean()), ref, tol).ok
        noise = np.random.default_rng(1).standard_normal(ref.shape) * ref.std()
        assert not compare(noise, ref, tol).ok
        # the reference with one block perturbed fails
        perturbed = ref.astype(np.float64).copy()
        block = tuple(slice(0, max(1, s // 4)) for s in ref.shape)
        perturbed[block] += ref.std() * 0.5 + 1e-3
        assert not compare(perturbed, ref, tol).ok
        # an input returned as the output fails (where shapes match)
        for a in inputs:
            if a.shape == ref.shape:
                assert not compare(a.astype(np.float64), ref, tol).ok


def test_nan_anywhere_fails():
    ref = np.ones((8, 128), np.float32)
    out = ref.copy()
    out[3, 7] = np.nan
    result = compare(out, ref, all_tasks()[0].tolerances["float32"])
    assert not result.ok and result.nonfinite == 1


@pytest.mark.parametrize("poison", [None, np.nan, np.inf])
def test_metrics_are_the_plain_formulas_with_non_finite_values_set_aside(poison):
    """compare() takes shortcuts when every value is finite (coverage cases have millions);
    its metrics must still be the plain definitions, with and without non-finite values."""
    rng = np.random.default_rng(3)
    tol = Tolerance(atol=1e-5, rtol=1e-5, rel_l2=1e-4)
    ref = rng.standard_normal((64, 96)).astype(np.float32)
    ref[5, :] = 0.0
    out = (ref + 1e-6 * rng.standard_normal(ref.shape)).astype(np.float32)
    out[40, 7] += 0.5  # the worst element
    tpu = (ref + 1e-4 * rng.standard_normal(ref.shape)).astype(np.float32)
    if poison is not None:
        out[2, 3] = poison
    got = compare(out, ref, tol, tpu)
    o, r, t = (a.astype(np.float64) for a in (out, ref, tpu))
    err = np.abs(o - r)
    finite = np.isfinite(err)
    allowed = tol.atol * np.sqrt(np.mean(r ** 2)) + tol.rtol * np.abs(r) + 2.0 * np.abs(t - r)
    assert got.max_abs_err == err[finite].max()
    assert got.max_rel_err == (err / np.maximum(np.abs(r), 1e-30))[finite].max()
    assert got.worst_index == ([40, 7] if poison is None else [2, 3])  # a non-finite value is worst
    assert got.mismatch_fraction == np.mean(~(err <= allowed))
    assert got.nonfinite == (0 if poison is None else 1)
    if poison is None:
        assert got.rel_l2_err == np.linalg.norm(err) / np.linalg.norm(r)
        assert got.bound_ratio == max(np.max(err / allowed), got.rel_l2_err / tol.rel_l2)
    else:
        assert got.rel_l2_err == float("inf") and got.bound_ratio == float("inf") and not got.ok
