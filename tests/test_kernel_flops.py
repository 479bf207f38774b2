"""FLOPs inside kernels: loops whose trip count depends on data count at their maximum,
convolutions count their whole window, and every solution's kernels do (at least half of)
the reference's arithmetic at every bench size. Tracing only: nothing here runs a kernel."""
import importlib.util
import math
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.analysis import intervals
from evaluator.analysis.jaxpr_analysis import summarize
from evaluator.analysis.jaxpr_cost import Cost, total_flops
from evaluator.performance.hardware import GENERATIONS
from evaluator.performance.perf_model import estimate
from evaluator.truth.reference import ReferenceCache
from tasks import all_tasks, get_task
from tasks.spec import ArgSpec, np_dtype
from tests.conftest import SAMPLE_TASKS, sampled

I32 = jax.ShapeDtypeStruct((), jnp.int32)
# One iteration of _loop_kernel's body: an (8, 128) x (128, 128) matmul, the add of its
# result, the loop counter's increment and the loop condition's comparison.
LOOP_BODY_FLOPS = 2 * 8 * 128 * 128 + 8 * 128 + 1 + 1


@pytest.fixture(autouse=True)
def _tpu_device_kind(monkeypatch):
    """Like the worker (`_pretend_device_kind`): Pallas code that asks which TPU it is on
    sees one rather than the CPU."""
    from jax._src.pallas.mosaic import tpu_info

    monkeypatch.setattr(tpu_info, "get_device_kind", lambda: "TPU v5 lite")
    monkeypatch.setattr(tpu_info, "get_num_device_cores", lambda: 1)


def _specs(args: list[ArgSpec]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, np_dtype(a.dtype)) for a in args]


def _program(fn, *specs_and_bounds):
    closed = jax.make_jaxpr(fn)(*[s for s, _ in specs_and_bounds])
    return closed, [b for _, b in specs_and_bounds]


# --- integer input bounds --------------------------------------------------------------
def _integer(dtype: str) -> bool:
    return np_dtype(dtype).kind in "iu"


@pytest.mark.parametrize("task", sampled(all_tasks(), SAMPLE_TASKS, ids=lambda t: t.name))
def test_integer_inputs_are_bounded_and_draws_stay_within(task):
    for case in task.select("all", "check"):
        bounds = task.arg_bounds(case)
        specs = task.arg_specs(case)
        assert [b is not None for b in bounds] == [_integer(a.dtype) for a in specs], (
            f"{case.name}: every integer argument, and only those, needs bounds")
        if not any(bounds):
            continue  # float inputs only: nothing to draw
        for seed in range(4):
            for arg, bound in zip(task.make_inputs(case, np.random.default_rng(seed)), bounds):
                if bound is not None:
                    assert bound[0] <= arg.min() and arg.max() <= bound[1], (case.name, seed, bound)


def test_bounds_flow_through_the_glue():
    v = jax.ShapeDtypeStruct((4,), jnp.int32)
    outs = lambda fn, b=(1, 1000): intervals.analyze_program(*_program(fn, (v, b))).outputs  # noqa: E731
    assert outs(lambda n: (n + 127) // 128) == [intervals.Interval(1, 8)]  # floor division
    assert outs(lambda n: (n - 500) // 128) == [intervals.Interval(-4, 3)]
    assert outs(lambda n: jnp.clip(n * 3, 5, 100)) == [intervals.Interval(5, 100)]
    assert outs(lambda n: jnp.where(n > 1000, 10 ** 6, n)) == [intervals.Interval(1, 1000)]
    assert outs(lambda n: n.astype(jnp.float32).astype(jnp.int32).reshape(2, 2)[0]) == [
        intervals.Interval(1, 1000)]
    assert outs(lambda n: jnp.sum(n)) == [intervals.Interval(4, 4000)]
    assert outs(lambda n: n - n, None) == [intervals.Interval(0, 0)]
    assert not outs(lambda n: n + 1, None)[0].bounded
    assert not outs(lambda n: n * 2 ** 30)[0].bounded  # may overflow int32: anything


def test_while_loop_trip_counts():
    def count_down(n):  # i > 0, step -2, from n <= 10: at most 5 trips
        return lax.while_loop(lambda c: c[0] > 0, lambda c: (c[0] - 2, c[1] + 1.0), (n, 0.0))[1]

    def fori(lo, hi):
        return lax.fori_loop(lo, hi, lambda i, a: a + i, 0)

    def nested(n):  # the inner loop runs i + 1 <= n times
        return lax.fori_loop(0, n, lambda i, a: lax.fori_loop(0, i + 1, lambda j, b: b + j, a), 0)

    def scaled(n):  # not `counter < bound`: unknown
        return lax.while_loop(lambda c: c * 2 < n, lambda c: c + 1, 0)

    trips = lambda *program: list(intervals.analyze_program(*program).loop_trips.values())  # noqa: E731
    assert trips(*_program(count_down, (I32, (0, 10)))) == [5]
    assert trips(*_program(fori, (I32, (2, 5)), (I32, (3, 20)))) == [18]
    assert sorted(trips(*_program(nested, (I32, (0, 10))))) == [10, 10]
    assert trips(*_program(scaled, (I32, (0, 10)))) == [None]
    assert trips(*_program(fori, (I32, None), (I32, (3, 20)))) == [None]


# --- a kernel with a data-dependent loop ------------------------------------------------
def _loop_kernel(n_ref, x_ref, w_ref, o_ref):
    def body(i, acc):
        return acc + jnp.dot(acc, w_ref[...], preferred_element_type=jnp.float32)

    o_ref[...] = lax.fori_loop(0, n_ref[0], body, x_ref[...])


def _loop_call(x, w, lengths):
    """The trip count is a number of 128-blocks computed outside, prefetched into SMEM."""
    block = lambda shape: pl.BlockSpec(shape, lambda i, n: (0, 0))  # noqa: E731
    return pl.pallas_call(
        _loop_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[block((8, 128)), block((128, 128))],
            out_specs=block((8, 128))),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
    )((lengths.astype(jnp.int32) + 127) // 128, x, w)


LOOP_SPECS = [jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((128, 128), jnp.float32),
              jax.ShapeDtypeStruct((3,), jnp.int32)]


def test_data_dependent_loop_counts_at_its_maximum_given_bounds():
    closed = jax.make_jaxpr(jax.jit(_loop_call))(*LOOP_SPECS)
    (bounded,) = summarize(closed, traffic=True, arg_bounds=[None, None, (1, 1000)]).pallas_calls
    (unbounded,) = summarize(closed, traffic=True).pallas_calls
    # lengths <= 1000 -> at most 8 blocks of 128: 8 trips; without bounds, one, flagged.
    assert bounded.flops_per_step - unbounded.flops_per_step == 7 * LOOP_BODY_FLOPS
    assert not bounded.data_dependent_trips and unbounded.data_dependent_trips
    (wider,) = summarize(closed, traffic=True, arg_bounds=[None, None, (0, 4096)]).pallas_calls
    assert wider.flops_per_step - unbounded.flops_per_step == 31 * LOOP_BODY_FLOPS


def test_unknown_trip_count_makes_the_estimate_a_lower_bound():
    closed = jax.make_jaxpr(_loop_call)(*LOOP_SPECS)
    args = [ArgSpec(s.shape, str(s.dtype)) for s in LOOP_SPECS]
    outs = [ArgSpec((8, 128), "float32")]
    gen = GENERATIONS["v5e"]
    reference = Cost(flops=1.0)
    flagged = estimate("c", summarize(closed, traffic=True), gen, reference, args, outs)
    bounded = estimate("c", summarize(closed, traffic=True, arg_bounds=[None, None, (1, 128)]),
                       gen, reference, args, outs)
    assert flagged.lower_bound and "lower bound" in flagged.summary()
    assert not bounded.lower_bound and "lower bound" not in bounded.summary()


def _grid_loop_kernel(x_ref, o_ref):
    """Row block i sums blocks 0..i (a causal-style loop bounded by program_id), each with
    an inner loop of i + 1 trips."""
    i = pl.program_id(0)

    def inner(j, acc):
        return acc + x_ref[...]

    o_ref[...] = lax.fori_loop(0, i + 1, lambda k, acc: lax.fori_loop(0, i + 1, inner, acc),
                               jnp.zeros_like(o_ref))


def _pallas_eqn(closed):
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    return eqn


def test_loops_bounded_by_the_grid():
    spec = jax.ShapeDtypeStruct((32, 128), jnp.float32)
    closed = jax.make_jaxpr(lambda x: pl.pallas_call(
        _grid_loop_kernel, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)), out_shape=spec)(x))(spec)
    assert sorted(intervals.kernel_loop_trips(_pallas_eqn(closed)).values()) == [4, 4]


def _overwriting_kernel(n_ref, x_ref, o_ref):
    n_ref[0] = 0  # after this, the prefetched value says nothing about the loop
    o_ref[...] = lax.fori_loop(0, n_ref[0], lambda i, acc: acc + x_ref[...], x_ref[...])


def test_prefetch_ref_written_by_the_kernel_loses_its_bounds():
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    block = pl.BlockSpec((8, 128), lambda i, n: (0, 0))
    closed = jax.make_jaxpr(lambda x, n: pl.pallas_call(
        _overwriting_kernel, out_shape=spec,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,), in_specs=[block],
                                               out_specs=block))(n, x))(
        spec, jax.ShapeDtypeStruct((1,), jnp.int32))
    eqn = _pallas_eqn(closed)
    operands = intervals.analyze_program(closed, [None, (1, 50)]).pallas_operands[id(eqn)]
    assert operands[0] == intervals.Interval(1, 50)
    assert list(intervals.kernel_loop_trips(eqn, operands).values()) == [None]


def _tiled_call(x, sizes, read_table_at_step: bool):
    """A grid of as many steps as the tiles that `sizes` cover (a traced count, as megablox
    gmm's active tiles), each step's row block looked up in a 16-long tile table, or not."""
    table = jnp.arange(16, dtype=jnp.int32)
    steps = jnp.sum((sizes + 7) // 8)
    rows = (lambda i, ids: (ids[i], 0)) if read_table_at_step else (lambda i, ids: (0, 0))
    return pl.pallas_call(
        lambda ids, x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2.0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(steps,), in_specs=[pl.BlockSpec((8, 128), rows)],
            out_specs=pl.BlockSpec((8, 128), rows)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(table, x)


def test_a_dynamic_grid_runs_no_further_than_the_table_its_steps_read():
    """sizes: 4 values in [0, 128], so the interval bound of the step count is 4 x 16 = 64;
    a step index that reads a 16-long table cannot go past 16 steps without reading outside it."""
    specs = [jax.ShapeDtypeStruct((128, 128), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)]
    grids = {}
    for reads in (True, False):
        closed = jax.make_jaxpr(lambda x, s: _tiled_call(x, s, reads))(*specs)
        (call,) = summarize(closed, traffic=True, arg_bounds=[None, (0, 128)]).pallas_calls
        grids[reads] = call.grid
        assert not call.data_dependent_trips
    assert grids == {True: [16], False: [64]}


# --- convolutions -----------------------------------------------------------------------
def test_convolution_flops_count_the_window_and_features_per_group():
    x = jax.ShapeDtypeStruct((2, 10, 6), jnp.float32)  # NWC, 6 input features
    w = jax.ShapeDtypeStruct((3, 3, 4), jnp.float32)   # WIO: 2 groups of 3 features, 4 outputs
    conv = lambda x, w: lax.conv_general_dilated(  # noqa: E731
        x, w, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=2)
    # output [2, 8, 4]; each element a dot over 3 taps x 3 features of its group
    assert total_flops(jax.make_jaxpr(conv)(x, w)) == 2 * (2 * 8 * 4) * (3 * 3)


def test_conv1d_reference_flops():
    task = get_task("conv1d")
    for case in task.select("all"):
        d = case.dims
        expected = 2.0 * d["b"] * (d["l"] - d["k"] + 1) * d["cout"] * d["k"] * d["cin"]
        assert ReferenceCache().flops(task, case) == pytest.approx(expected, rel=1e-3)


# --- the solutions ----------------------------------------------------------------------
@lru_cache(maxsize=None)
def _solution(task_name: str):
    task = get_task(task_name)
    spec = importlib.util.spec_from_file_location(f"solution_{task_name}", task.solution_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REFERENCE = ReferenceCache()
BENCH = [(t.name, c.name) for t in all_tasks() for c in t.select("all", "bench")]


def kernel_flops_ratio(task_name: str, case_name: str) -> tuple[float, float]:
    """(FLOPs inside the solution's kernels, the reference's FLOPs) at a bench case."""
    task = get_task(task_name)
    case = next(c for c in task.cases if c.name == case_name)
    closed = jax.make_jaxpr(_solution(task_name).kernel)(*_specs(list(task.arg_specs(case))))
    summary = summarize(closed, traffic=True, arg_bounds=task.arg_bounds(case))
    return summary.kernel_flops, _REFERENCE.flops(task, case)


@pytest.mark.parametrize("task_name,case_name", sampled(BENCH, SAMPLE_TASKS, ids=lambda tc: f"{tc[0]}-{tc[1]}",
                                                        key=lambda task, case: task))
def test_solution_kernels_do_the_reference_arithmetic(task_name, case_name):
    inside, reference = kernel_flops_ratio(task_name, case_name)
    assert inside >= 0.5 * reference, f"{inside:.4g} FLOPs inside kernels vs {reference:.4g}"


def test_paged_attention_counts_every_chunk_and_its_dmas():
    task = get_task("paged_attention")
    case = task.select("train", "bench")[0]
    d = case.dims
    closed = jax.make_jaxpr(_solution("paged_attention").kernel)(*_specs(list(task.arg_specs(case))))
    (call,) = summarize(closed, traffic=True, arg_bounds=task.arg_bounds(case)).pallas_calls
    (once,) = summarize(closed, traffic=True).pallas_calls
    # One grid step per sequence, all kv heads at once. Chunks of 256 tokens (16 pages of 16);
    # lengths up to 256 pages: at most 16 chunks, each copied once (k and v pages of every kv
    # head). Without the lengths' bounds the loop counts once: the first chunk and one more.
    chunk_bytes = (256 // d["page_size"]) * 2 * d["hkv"] * d["page_size"] * d["d"] * 4
    chunks = math.ceil(d["pages_per_seq"] * d["page_size"] / 256)
    assert call.grid == [d["b"]]
    assert call.dma_bytes_per_step == chunks * chunk_bytes
    assert once.dma_bytes_per_step == 2 * chunk_bytes and once.data_dependent_trips
    assert not call.data_dependent_trips
    # Per sequence: every query head [d] against every key and value of the chunks.
    dots = chunks * 2 * (2 * d["hq"] * 256 * d["d"])
    assert dots <= call.flops_per_step <= 1.2 * dots
