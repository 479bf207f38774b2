"""One program at every size: bench-size shortcuts are refused, rewrites that need less work are not."""
from evaluator.analysis import one_program
from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary
from evaluator.analysis.jaxpr_cost import Cost
from evaluator.stages import _missing_work
from suites.jaxbench import IMPORTED_WORK_SLACK
from tasks import get_task


def call(name: str, *primitives: str, flops: float = 0.0) -> PallasCallInfo:
    return PallasCallInfo(name, [1], [], [], 0, None, None, ["get", "swap", *primitives],
                          flops_per_step=flops)


def program(*calls: PallasCallInfo) -> TraceSummary:
    return TraceSummary(list(calls), Cost(), [])


CHECKS = [("check_a", program(call("mm", "dot_general", "select_n", "iota"))),   # ragged: masks too
          ("check_b", program(call("mm", "dot_general")))]


def test_the_same_kernels_computing_the_same_kinds_of_work_pass():
    assert one_program.shortcut(program(call("mm", "dot_general", "add")), CHECKS) is None


def test_a_kernel_that_runs_only_at_bench_sizes_is_a_shortcut():
    why = one_program.shortcut(program(call("mm", "dot_general"), call("zeros")), CHECKS)
    assert "zeros runs here but at no check case" in why


def test_a_kernel_that_drops_its_matmul_at_bench_sizes_is_a_shortcut():
    why = one_program.shortcut(program(call("mm", "add")), CHECKS)
    assert "no longer computes dot_general" in why


def test_a_kernel_left_out_at_bench_sizes_is_a_shortcut():
    checks = [("check", program(call("stats", "reduce_max", "exp"), call("normalise", "div")))]
    why = one_program.shortcut(program(call("stats", "reduce_max", "exp")), checks)
    assert "normalise" in why and "do not run here" in why


def test_the_work_floor_judges_kernels_that_do_the_tasks_work_at_check_sizes():
    case = get_task("matmul").select("train", "bench")[0]
    needed = 1e12
    tenth = program(call("mm", "dot_general", flops=0.1 * needed))
    assert _missing_work(tenth, needed, case) is not None                   # all the work at check sizes
    assert _missing_work(tenth, needed, case, check_share=0.6) is not None  # most of it there, a tenth here
    assert _missing_work(tenth, needed, case, check_share=0.2) is None      # a rewrite: less everywhere
    nothing = program(call("mm", "dot_general", flops=0.0))
    assert _missing_work(nothing, needed, case, check_share=0.0) is not None  # no arithmetic at all


def test_skipping_blocks_only_at_bench_sizes_is_refused_unless_the_task_does_not_say_what_may_be_skipped():
    """1p_Flash_Attention's optimized.py: 101% of the reference's FLOPs at its one-block check
    size, 76% at its bench size (masked causal blocks skipped). Our tasks declare such skips
    (necessary_flops_share), so the drop is refused there; an imported workload does not, and
    keeps half the check share as its floor."""
    case = get_task("matmul").select("train", "bench")[0]
    needed = 1e12
    skipping = program(call("attn", "dot_general", flops=0.76 * needed))
    assert _missing_work(skipping, needed, case, check_share=1.01) is not None
    assert _missing_work(skipping, needed, case, check_share=1.01, slack=IMPORTED_WORK_SLACK) is None
    assert _missing_work(program(call("attn", "dot_general", flops=0.4 * needed)), needed, case,
                         check_share=1.01, slack=IMPORTED_WORK_SLACK) is not None



_NAMED_BY_SHAPE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

def _zeros(x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)

def kernel(x):
    body = _zeros if x.shape[0] > SWAP_ABOVE else _double
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          name=f"double-m_{x.shape[0]}-n_{x.shape[1]}")(x)
'''


def _traced(rows: int, swap_above: int) -> TraceSummary:
    import jax
    import jax.numpy as jnp

    from evaluator.analysis.jaxpr_analysis import summarize

    namespace: dict = {"SWAP_ABOVE": swap_above}
    exec(compile(_NAMED_BY_SHAPE, "candidate.py", "exec"), namespace)
    return summarize(jax.make_jaxpr(namespace["kernel"])(jax.ShapeDtypeStruct((rows, 128), jnp.float32)))


def test_a_kernel_named_after_its_shapes_is_the_same_kernel_at_every_size():
    """ejkernel and tpu-inference name their pallas_calls after their shapes and tiles
    ("gmm_v3-g_8-m_8192-k_2048-..."): the same body under another name at bench sizes is the same
    kernel, told by where its body is defined; another body under the same scheme is not."""
    honest = one_program.shortcut(_traced(1024, swap_above=10**9), [("check", _traced(16, swap_above=10**9))])
    assert honest is None
    swapped = one_program.shortcut(_traced(1024, swap_above=512), [("check", _traced(16, swap_above=512))])
    assert "double-m_1024-n_128 runs here but at no check case" in swapped
