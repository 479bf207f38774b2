"""Work that runs: a pl.when decided by the grid position counts only on the grid steps that
take it (evaluator/analysis/grid_conds.py), and only loops sized by the task's integer inputs leave the
work rules undecided (evaluator/analysis/trip_origin.py). Tracing only: nothing here runs a kernel."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.analysis.jaxpr_analysis import PallasCallInfo, TraceSummary, summarize
from evaluator.analysis.jaxpr_cost import Cost
from evaluator.stages import _missing_work
from tasks import get_task

N, B = 1024, 256  # a 4 x 4 x 4 grid of 256-blocks
G = N // B
BLOCK_DOT = 2.0 * B ** 3
F32 = jax.ShapeDtypeStruct((N, N), jnp.float32)


def _matmul(runs_dot, reads_data: str = ""):
    """A tiled matmul whose dot runs where `runs_dot(i, j, k)` holds (accumulator init at
    k == 0, store at the last k); `reads_data` "or" / "and": the predicate also reads x."""

    def body(x_ref, y_ref, o_ref, acc_ref):
        i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        pred = runs_dot(i, j, k)
        if reads_data == "or":
            pred = pred | (x_ref[0, 0] > 1e30)
        elif reads_data == "and":
            pred = (x_ref[0, 0] == x_ref[0, 0]) & pred  # true for any finite x

        @pl.when(pred)
        def _():
            acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    def kernel(x, y):
        return pl.pallas_call(
            body, grid=(G, G, G),
            in_specs=[pl.BlockSpec((B, B), lambda i, j, k: (i, k)),
                      pl.BlockSpec((B, B), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((B, B), lambda i, j, k: (i, j)),
            out_shape=F32, scratch_shapes=[pltpu.VMEM((B, B), jnp.float32)])(x, y)

    (call,) = summarize(jax.make_jaxpr(kernel)(F32, F32), traffic=True).pallas_calls
    return call


def _dot_steps(call: PallasCallInfo) -> float:
    """Grid steps on which the block dot was counted."""
    return call.flops / BLOCK_DOT


def test_pl_when_on_the_grid_counts_only_the_steps_that_take_it():
    every = _dot_steps(_matmul(lambda i, j, k: k >= 0))
    assert every == pytest.approx(G ** 3, rel=0.01)
    # The cheat: the dot on the first output block only, 4 of 64 steps.
    assert _dot_steps(_matmul(lambda i, j, k: (i == 0) & (j == 0))) == pytest.approx(G, rel=0.02)
    # Causal block skipping (j <= i): 10 of 16 (i, j) pairs, each over 4 k steps.
    assert _dot_steps(_matmul(lambda i, j, k: j <= i)) == pytest.approx(10 * G, rel=0.02)
    # Arithmetic on the ids (`//`, `%`, num_programs) is evaluated too.
    assert _dot_steps(_matmul(lambda i, j, k: (i * G + j) % 5 == pl.num_programs(0) // 4 - 1)) == (
        pytest.approx(4 * G, rel=0.05))  # (i, j) with 4i + j in {0, 5, 10, 15}
    # Negative ids and a truncating division: lax's `div` and `rem` round toward zero.
    assert _dot_steps(_matmul(lambda i, j, k: lax.div(i - 2, 2) + lax.rem(j - 3, 2) == 0)) == (
        pytest.approx(6 * G, rel=0.05))  # div: -1, 0, 0, 0 over i; rem: -1, 0, -1, 0 over j (floor: 8)


def test_a_predicate_in_floats_is_evaluated_as_jax_computes_it():
    # Not one of the integer ops computed with numpy: bound by jax over every grid point.
    steps = _dot_steps(_matmul(lambda i, j, k: jnp.sin(i.astype(jnp.float32)) > 0.5))
    assert steps == pytest.approx(2 * G * G, rel=0.02)  # sin(1), sin(2) > 0.5; sin(0), sin(3) not


def test_predicates_that_read_data_keep_the_dearest_branch():
    call = _matmul(lambda i, j, k: (i == 0) & (j == 0), reads_data="or")
    assert _dot_steps(call) == pytest.approx(G ** 3, rel=0.01)
    # Anded with a grid condition, data can only narrow where the branch runs.
    call = _matmul(lambda i, j, k: (i == 0) & (j == 0), reads_data="and")
    assert _dot_steps(call) == pytest.approx(G, rel=0.02)


def test_nested_and_looped_conds_follow_the_grid_points_that_reach_them():
    def body(x_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        @pl.when(i == j)
        def _():
            @pl.when(i != j)  # never taken where the outer one is
            def _():
                o_ref[...] = jnp.dot(x_ref[...], x_ref[...])

        def step(t, carry):
            @pl.when(i == 0)  # inside a loop of 3 trips: 4 of 16 grid points
            def _():
                o_ref[...] += jnp.dot(x_ref[...], x_ref[...])
            return carry

        lax.fori_loop(0, 3, step, 0)

    def kernel(x):
        return pl.pallas_call(
            body, grid=(G, G), in_specs=[pl.BlockSpec((B, B), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((B, B), lambda i, j: (i, j)), out_shape=F32)(x)

    (call,) = summarize(jax.make_jaxpr(kernel)(F32), traffic=True).pallas_calls
    assert call.flops / BLOCK_DOT == pytest.approx(3 * G, rel=0.02)


def _looped_when(loop):
    """A 4 x 4 grid whose dot runs under a pl.when inside `loop(i, j, when)`."""
    def body(x_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        def when(pred):
            @pl.when(pred)
            def _():
                o_ref[...] += jnp.dot(x_ref[...], x_ref[...])

        o_ref[...] = jnp.zeros_like(o_ref)
        loop(i, j, when)

    def kernel(x):
        return pl.pallas_call(
            body, grid=(G, G), in_specs=[pl.BlockSpec((B, B), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((B, B), lambda i, j: (i, j)), out_shape=F32)(x)

    (call,) = summarize(jax.make_jaxpr(kernel)(F32), traffic=True).pallas_calls
    return call.flops / BLOCK_DOT


def test_loop_counters_in_a_predicate_are_evaluated_too():
    # A one-trip loop around the cheat's predicate: the counter is always 0.
    def one_trip(i, j, when):
        lax.fori_loop(0, 1, lambda t, c: (when((i + t == 0) & (j + t == 0)), c)[1], 0)

    assert _looped_when(one_trip) == pytest.approx(1, rel=0.02)

    # Four trips, the dot on the last one at row 0: 4 grid points, one trip each.
    def last_trip(i, j, when):
        lax.fori_loop(0, 4, lambda t, c: (when((t == 3) & (i == 0)), c)[1], 0)

    assert _looped_when(last_trip) == pytest.approx(4, rel=0.02)

    # A loop whose length the grid sets (i + 1 trips, at most 4): the dot at t == 3 runs
    # only where the loop gets that far (row i == 3), 4 grid points.
    def grid_bound(i, j, when):
        lax.fori_loop(0, i + 1, lambda t, c: (when(t == 3), c)[1], 0)

    assert _looped_when(grid_bound) == pytest.approx(4, rel=0.02)


# --- where an unknown trip count comes from -------------------------------------------------
def _looping(n_ref, x_ref, o_ref):
    """A loop the interval analysis cannot bound: its condition is not one comparison."""
    def cond(c):
        return (c[0] < n_ref[0]) & (c[0] >= 0)

    def body(c):
        return c[0] + 1, c[1] + jnp.dot(c[1], x_ref[...], preferred_element_type=jnp.float32)

    o_ref[...] = lax.while_loop(cond, body, (0, x_ref[...]))[1]


def _loop_call(n, x):
    block = pl.BlockSpec((128, 128), lambda i, n_ref: (0, 0))
    return pl.pallas_call(
        _looping, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                               in_specs=[block], out_specs=block))(n, x)


X = jax.ShapeDtypeStruct((128, 128), jnp.float32)
LENGTHS = jax.ShapeDtypeStruct((2,), jnp.int32)


def _trip_origin(fn, specs, bounds):
    (call,) = summarize(jax.make_jaxpr(fn)(*specs), traffic=True, arg_bounds=bounds).pallas_calls
    assert call.data_dependent_trips
    return call


def test_only_the_tasks_integer_inputs_leave_a_loop_undecided():
    declared = _trip_origin(lambda n, x: _loop_call(n // 128, x), [LENGTHS, X], [(1, 4096), None])
    assert declared.unbounded_trips_from == "" and declared.undecided_trips
    undeclared = _trip_origin(lambda n, x: _loop_call(n, x), [LENGTHS, X], [None, None])
    assert undeclared.unbounded_trips_from == "integer data the task does not bound"
    decoy = lambda n, x: _loop_call((jnp.abs(x[0, :2]) * 1e-20).astype(jnp.int32) + 1, x)  # noqa: E731
    from_float = _trip_origin(decoy, [LENGTHS, X], [(1, 4096), None])
    assert from_float.unbounded_trips_from == "float data" and not from_float.undecided_trips
    # Mixed with a bounded length, still float data.
    mixed = lambda n, x: _loop_call(n + (x[0, :2] > 0).astype(jnp.int32), x)  # noqa: E731
    assert _trip_origin(mixed, [LENGTHS, X], [(1, 4096), None]).unbounded_trips_from == "float data"


def test_a_float_count_read_inside_the_kernel_is_float_data():
    def body(x_ref, o_ref):
        trips = (jnp.abs(x_ref[0, 0]) * 1e-20).astype(jnp.int32) + 1
        o_ref[...] = lax.fori_loop(0, trips, lambda i, acc: acc * 2.0, x_ref[...])

    fn = lambda x: pl.pallas_call(body, out_shape=X)(x)  # noqa: E731
    assert _trip_origin(fn, [X], [None]).unbounded_trips_from == "float data"


def test_work_rule_stays_on_for_float_trip_counts():
    task = get_task("matmul")
    case = task.select("train", "bench")[0]
    def summary(source: str) -> TraceSummary:
        call = PallasCallInfo("zeros_body", [16, 16], [], [], 0, None, None, [], flops_per_step=1.0,
                              data_dependent_trips=True, unbounded_trips_from=source)
        return TraceSummary([call], Cost(), [])

    assert _missing_work(summary(""), 1e11, case) is None  # undecided: the task's lengths
    failure = _missing_work(summary("float data"), 1e11, case)
    assert failure is not None and failure.status == "work_outside_kernel"
    assert "kernel zeros_body has a loop or grid whose length depends on float data" in failure.message
