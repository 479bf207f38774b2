"""One source of truth per task: the shapes a task states (arg_specs, out_specs, make_inputs,
the reference) agree at every case, checked without building bench-size arrays."""
import subprocess
import sys

import jax
import numpy as np
import pytest

from tasks import all_tasks
from tests.conftest import ROOT



def _leaves(tree):
    return [(tuple(leaf.shape), str(leaf.dtype)) for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.name)
def test_reference_output_matches_out_specs_at_every_case(task):
    for case in task.cases:
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in task.arg_specs(case)]
        got = _leaves(jax.eval_shape(task.reference, *specs))  # traced, never run
        expected = [(tuple(s.shape), s.dtype) for s in task.out_specs(case)]
        assert got == expected, f"{task.name} {case.name}: reference gives {got}, out_specs say {expected}"


@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.name)
def test_make_inputs_yields_exactly_arg_specs_at_check_sizes(task):
    for case in task.select("all", "check"):
        inputs = task.make_inputs(case, np.random.default_rng(0))
        got = [(tuple(a.shape), a.dtype.name) for a in inputs]
        expected = [(tuple(s.shape), s.dtype) for s in task.arg_specs(case)]
        assert got == expected, f"{task.name} {case.name}"
        bounds = task.arg_bounds(case)
        for a, bound in zip(inputs, bounds):
            if bound is not None:
                assert bound[0] <= a.min() and a.max() <= bound[1], (task.name, case.name, bound)


def test_importing_the_suite_runs_nothing_on_a_device():
    """`import tasks` registers 40 tasks without creating an array or tracing: no JAX backend
    is initialised (that is what makes an import heavy)."""
    code = ("import tasks, jax._src.xla_bridge as xb; assert len(tasks.all_tasks()) >= 40; "
            "print(len(xb._backends))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_references_use_only_their_module_and_the_shared_helpers():
    """What a prompt shows is what the evaluator compares with: a reference imports nothing of
    ours but tasks/references.py and tasks/spec.py."""
    import ast

    for task in all_tasks():
        path = ROOT / "tasks" / task.name / "task.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tasks."):
                names = {a.name for a in node.names}
                if node.module not in ("tasks.references", "tasks.spec"):
                    assert task.reference.__name__ not in names and not any(
                        n.endswith("reference") for n in names), (task.name, node.module, names)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_inputs_carry_the_forward_of_their_q_k_v(causal):
    """o and lse, which attention_bwd's kernels trust, are softmax attention of the given q, k, v
    for every (batch, head): built one slice at a time, checked here against the batched formula."""
    from tasks.attention_bwd.task import forward_stats

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 40, 16)) for _ in range(3))
    o, lse = forward_stats(q, k, v, causal=causal)
    s = q @ np.swapaxes(k, -1, -2) / 4.0
    if causal:
        s = np.where(np.tril(np.ones((40, 40), bool)), s, -np.inf)
    expected_lse = np.log(np.exp(s).sum(-1))
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12)
    np.testing.assert_allclose(o, np.exp(s - expected_lse[..., None]) @ v, rtol=1e-10, atol=1e-12)
