"""Work that reaches a kernel's outputs (evaluator/analysis/live_work.py), as provenance weighs it, and
required features judged where the work is (evaluator/features.check_feature)."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.analysis.features import check_feature, dominant_kernels
from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.analysis.live_work import live_work
from evaluator.analysis.provenance import kernel_origins
from evaluator.candidate.errors import CANDIDATE_FILENAME
from evaluator.execution.program import TracedProgram
from tasks import get_task
from tests.conftest import TESTS


def _program(source: str, specs):
    namespace: dict = {"__name__": "candidate_under_test"}
    exec(compile(source, CANDIDATE_FILENAME, "exec"), namespace)
    return TracedProgram.trace(namespace["kernel"], specs)


def _case_specs(task, case):
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in task.arg_specs(case)]


def _live(body, *scratch):
    """The live equations of `body` run as a one-step pallas_call on one (8, 128) block."""
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda a: pl.pallas_call(body, out_shape=x, scratch_shapes=list(scratch))(a))(x)
    (call,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    kernel = call.params["jaxpr"]
    return live_work(kernel, [kernel.invars[1]])  # invars: x, out, scratch...


def test_dead_vector_work_and_scalar_bookkeeping_weigh_nothing():
    def body(x_ref, o_ref, junk_ref):
        junk_ref[...] = jnp.exp(x_ref[...])  # never read: dead
        o_ref[...] = x_ref[...] * 2.0

    work = _live(body, pltpu.VMEM((8, 128), jnp.float32))
    names = [w.eqn.primitive.name for w in work]
    assert "mul" in names and "exp" not in names
    assert sum(w.work for w in work) == 8 * 128  # one multiply per element


def test_a_value_staged_through_scratch_is_followed_to_the_output():
    def body(x_ref, o_ref, buf_ref):
        buf_ref[...] = jnp.exp(x_ref[...])
        o_ref[...] = buf_ref[...] + 1.0

    names = [w.eqn.primitive.name for w in _live(body, pltpu.VMEM((8, 128), jnp.float32))]
    assert "exp" in names and "add" in names


def test_library_body_padded_with_dead_equations_is_still_the_librarys():
    """Most equations are ours (dead scalar stores), all the work is jax's matmul_kernel."""
    source = (TESTS / "redteam" / "library_body_padded_dead_scalars.py").read_text()
    spec = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    (origin,) = kernel_origins(_program(source, [spec, spec]).pallas_calls())
    assert origin.own_equations > 3 * sum(origin.library_equations.values())
    assert origin.library_share == 1.0 and origin.main_library.endswith("matmul.py")
    solution = get_task("matmul").solution_source()
    assert all(o.library_share == 0.0 for o in kernel_origins(_program(solution, [spec, spec]).pallas_calls()))


def test_a_side_kernel_does_not_satisfy_a_required_feature():
    task = get_task("matmul_int8_scaled")
    for case in (task.select("train", "check")[0], task.select("train", "bench")[0]):
        bench = case.size == "bench"
        cheat = _program((TESTS / "redteam" / "side_kernel_vmem_scratch.py").read_text(), _case_specs(task, case))
        calls = summarize(cheat.closed, traffic=bench).pallas_calls
        evidence, why = check_feature("vmem_scratch", calls, bench, list(task.arg_specs(case)))
        assert [e.used for e in evidence] == [True, False]  # the side kernel does use it
        assert why and why.startswith("only _stage_body uses it") and "_matmul_body (100%)" in why
        assert ("FLOPs" if bench else "bytes moved") in why
        honest = _program(task.solution_source(), _case_specs(task, case))
        calls = summarize(honest.closed, traffic=bench).pallas_calls
        assert check_feature("vmem_scratch", calls, bench, list(task.arg_specs(case)))[1] is None


def test_manual_dma_must_move_the_large_inputs():
    task = get_task("paged_attention")
    case = task.select("train", "bench")[0]
    cheat = _program((TESTS / "redteam" / "side_kernel_manual_dma.py").read_text(), _case_specs(task, case))
    calls = summarize(cheat.closed, traffic=True, arg_bounds=task.arg_bounds(case)).pallas_calls
    _, why = check_feature("manual_dma", calls, True, list(task.arg_specs(case)))
    assert why and "of the task's large inputs" in why
    honest = _program(task.solution_source(), _case_specs(task, case))
    calls = summarize(honest.closed, traffic=True, arg_bounds=task.arg_bounds(case)).pallas_calls
    assert check_feature("manual_dma", calls, True, list(task.arg_specs(case)))[1] is None


def test_dominant_kernels_are_the_heaviest_that_carry_half():
    assert dominant_kernels([0.2, 99.8]) == [1]
    assert dominant_kernels([40.0, 30.0, 30.0]) == [0, 1]  # a feature in either one counts
    assert dominant_kernels([57.0, 43.0]) == [0]
