"""The program that is checked is the program that runs; candidates load as real modules.

evaluator/execution/program.py (trace once, replay the jaxpr with pallas_calls re-issued) and the
worker's module handling, graded end to end and, where it is cheaper, in this process.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tasks import get_task

# A matmul that counts how often its Python runs. While it has run at most LIMIT times it
# builds a correct kernel; after that, one that doubles its output. An evaluator that called
# the candidate again after the checks (to lower, run or time it) would run the wrong one.
TRACE_COUNTING = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CALLS = [0]
LIMIT = {limit}


def body(x_ref, y_ref, o_ref, *, factor):
    o_ref[...] = (factor * jnp.dot(x_ref[...], y_ref[...],
                                   preferred_element_type=jnp.float32)).astype(o_ref.dtype)


def kernel(x, y):
    import functools
    CALLS[0] += 1
    factor = 1.0 if CALLS[0] <= LIMIT else 2.0
    m, n = x.shape[0], y.shape[1]
    bm = 128 if m % 128 == 0 else m
    bn = 128 if n % 128 == 0 else n
    return pl.pallas_call(
        functools.partial(body, factor=factor), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, x.shape[1]), lambda i, j: (i, 0)),
                  pl.BlockSpec((x.shape[1], bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, y)
'''


def test_the_candidate_runs_once_per_traced_case_and_nothing_else_runs(evaluator):
    task = get_task("matmul")
    traced = task.select("train")  # check sizes first, then bench sizes, then the coverage stage's
    checked = task.select("train", "check")
    # Right for every trace the checks see: an evaluator that called the Python again to
    # lower, run or time would meet the doubling kernel. The coverage stage's traces (probes,
    # derived cases) come after the task's cases; how many, the verdict says.
    counted = evaluator.grade("matmul", TRACE_COUNTING.format(limit=10 ** 6), seed=3)
    limit = len(traced) + counted.details["coverage_traces"]
    honest = evaluator.grade("matmul", TRACE_COUNTING.format(limit=limit), seed=3)
    assert honest.status == "correct", honest.message
    # Wrong from the last check case's trace on: that case's run shows the doubling kernel,
    # the program traced for it, and no other case fails.
    switched = evaluator.grade("matmul", TRACE_COUNTING.format(limit=len(checked) - 1), seed=3)
    assert switched.status == "wrong_output", switched.message
    statuses = {c.name: c.status for c in switched.cases}
    assert statuses[checked[-1].name] == "wrong_output"
    assert all(statuses[c.name] == "correct" for c in checked[:-1]), statuses


VMAPPED = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def softmax_body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def rows_softmax(x):  # [rows, d], one block of 8 rows per step (the last one ragged)
    rows, d = x.shape
    return pl.pallas_call(
        softmax_body, grid=(pl.cdiv(rows, 8),),
        in_specs=[pl.BlockSpec((8, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)


def kernel(x):
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    chunks = 2 if rows % 16 == 0 else 1
    out = jax.vmap(rows_softmax)(flat.reshape(chunks, rows // chunks, flat.shape[-1]))
    return out.reshape(x.shape)
'''


def test_a_vmapped_pallas_call_with_dimension_semantics_runs_as_it_lowers(evaluator):
    """vmap adds a grid axis but not its semantics: Mosaic marks it parallel, and so do we."""
    verdict = evaluator.grade("softmax", VMAPPED, seed=5)
    assert verdict.status == "correct", verdict.message


INTERPRET_PARAMETER = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def softmax(x, *, interpret={default}):
    flat = x.reshape(-1, x.shape[-1])
    rows = 8 if flat.shape[0] % 8 == 0 else flat.shape[0]
    out = pl.pallas_call(
        body, grid=(flat.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, flat.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, x.dtype), interpret=interpret)(flat)
    return out.reshape(x.shape)


def kernel(x):
    return softmax(x)
'''


def test_interpret_is_judged_by_what_the_pallas_call_got(evaluator):
    passed_through = evaluator.grade("softmax", INTERPRET_PARAMETER.format(default="False"), seed=1)
    assert passed_through.status == "correct", passed_through.message
    computed = evaluator.grade("softmax", INTERPRET_PARAMETER.format(default="len('on') > 0"), seed=1)
    assert computed.status == "policy_violation", computed.message
    assert "interpret=True" in computed.message and computed.stage == "structure"


DATACLASS_CONFIG = '''
import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class Blocks:
    rows: int
    label: str = ""

    def __post_init__(self):
        if self.rows % 8:
            raise ValueError(f"rows must be a multiple of 8, got {{self.rows}}")
        object.__setattr__(self, "label", f"rows={{self.rows}}")


def body(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def kernel(x):
    assert typing.get_type_hints(Blocks)["rows"] is int
    blocks = Blocks(8)
    flat = x.reshape(-1, x.shape[-1])
    out = pl.pallas_call(
        body, grid=(pl.cdiv(flat.shape[0], blocks.rows),),
        in_specs=[pl.BlockSpec((blocks.rows, flat.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((blocks.rows, flat.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, x.dtype))(flat)
    return out.reshape(x.shape)
'''


def test_a_frozen_dataclass_with_post_init_works(evaluator):
    verdict = evaluator.grade("softmax", DATACLASS_CONFIG.format(), seed=2)
    assert verdict.status == "correct", verdict.message


def test_candidate_modules_are_registered_and_removed(tmp_path, monkeypatch):
    """In this process: load registers a fresh module name, reset removes it."""
    import sys

    from evaluator.execution import handlers
    from evaluator.execution.protocol import Done, Load, Reset

    monkeypatch.chdir(tmp_path)  # reset empties the working directory
    state = handlers.WorkerState(interpret=True)
    names = []
    for _ in range(2):
        reply, _ = handlers.handle(state, Load(DATACLASS_CONFIG.format()), [])
        assert isinstance(reply, Done), reply
        names.append(state.module.__name__)
        assert sys.modules[names[-1]] is state.module
        assert state.module.Blocks.__module__ == names[-1]
        handlers.handle(state, Reset(), [])
        assert names[-1] not in sys.modules
    assert names[0] != names[1]


def test_a_missing_race_hook_stops_the_worker_loudly(monkeypatch):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from evaluator.execution import jax_hooks

    @dataclasses.dataclass
    class NoRaceFlag:  # what a jax upgrade could leave behind
        num_cores: int

    monkeypatch.setattr(ipc, "RaceDetectionState", NoRaceFlag)
    with pytest.raises(jax_hooks.HookError, match="races_found"):
        jax_hooks.install_race_recorder()


def test_the_race_check_over_access_logs_finds_what_jaxs_own_check_finds(monkeypatch, capsys):
    """The recorder's whole-log race check (jax_hooks.AccessLog) against jax's RaceDetectionState
    on random accesses (a core's clock and DMAs' clocks behind it, buffers, ranges of slices and
    indices, reads and writes): the same access is the first found racing, or none is in both."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.pallas.mosaic.interpret.race_detection_state import RaceDetectionState as JaxRaceState

    from evaluator.execution import jax_hooks

    monkeypatch.setattr(ipc, "RaceDetectionState", JaxRaceState)
    jax_hooks.install_race_recorder()
    rng = np.random.default_rng(0)
    racing = 0
    for _ in range(300):
        theirs, ours = JaxRaceState(num_cores=1), ipc.RaceDetectionState(num_cores=1)
        first: dict[str, int] = {}
        core = np.zeros(3, dtype=np.int32)  # the core's clock; now and then a DMA's, then a wait
        dma, history = core.copy(), []
        for step in range(30):
            core[0] += 1
            history.append(core.copy())
            clock, draw = core.copy(), rng.random()
            if draw < 0.2:
                dma[1 + rng.integers(0, 2)] += 1
                clock = dma.copy()
            elif draw < 0.3:  # a clock from the past: before accesses already logged
                clock = history[rng.integers(0, len(history))].copy()
            elif draw < 0.5:
                core[:] = np.maximum(core, dma)  # the core waited for the DMAs so far
            start = int(rng.integers(0, 16))
            rnge = (slice(start, start + int(rng.integers(1, 4)), 1), int(rng.integers(0, 2)))
            key = ("vmem", int(rng.integers(0, 2)), 0, 0)
            method = "check_read" if rng.random() < 0.6 else "check_write"
            for name, state in (("theirs", theirs), ("ours", ours)):
                getattr(state, method)(0, 0, clock, key, rnge)
                if state.races_found:
                    first.setdefault(name, step)
        assert first.get("ours") == first.get("theirs")
        racing += "theirs" in first
    assert 30 < racing < 270, racing  # both outcomes are exercised
    assert jax_hooks.take_races() > 0  # our state's races became records, as a grading reads them
    capsys.readouterr()  # jax's detector prints what it finds


def test_a_changed_semaphore_stops_the_worker_loudly(monkeypatch):
    from jax._src.pallas.mosaic.interpret import shared_memory

    from evaluator.execution import jax_hooks

    class CountsElsewhere:  # what a jax upgrade could leave behind
        def __init__(self):
            self.counts = {}

    monkeypatch.setattr(shared_memory, "Semaphore", CountsElsewhere)
    with pytest.raises(jax_hooks.HookError, match="count_by_core"):
        jax_hooks.install_deadlock_detector()


def test_a_changed_shared_memory_stops_the_worker_loudly(monkeypatch):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from evaluator.execution import jax_hooks

    monkeypatch.delattr(ipc, "_validate")  # what a jax upgrade could leave behind
    with pytest.raises(jax_hooks.HookError, match="_validate"):
        jax_hooks.install_exit_check()


def test_replay_runs_the_traced_jaxpr_through_control_flow():
    """scan, cond and vmap around pallas_calls, replayed in interpret mode and lowered for TPU."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.execution.program import TracedProgram, replay

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def one(x):
        return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
                              in_specs=[pl.BlockSpec(x.shape, lambda i: (0, 0))],
                              out_specs=pl.BlockSpec(x.shape, lambda i: (0, 0)),
                              compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)

    calls = []

    def program(x):
        calls.append(1)
        summed, ys = jax.lax.scan(lambda c, xi: (c + one(xi).sum(), one(xi)), jnp.float32(0), x)
        picked = jax.lax.cond(x[0, 0, 0] > 0, one, lambda a: one(a) * 3, x[0])
        return jax.vmap(one)(x), summed, ys, picked

    spec = jax.ShapeDtypeStruct((4, 8, 128), jnp.float32)
    traced = TracedProgram.trace(program, [spec])
    assert len(traced.pallas_calls()) == 5 and len(calls) == 1
    x = np.random.default_rng(0).standard_normal((4, 8, 128)).astype(np.float32)
    batched, summed, ys, picked = jax.jit(replay(traced, interpret=pltpu.InterpretParams()))(x)
    np.testing.assert_allclose(batched, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(ys, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(summed, (2 * x).sum(), rtol=1e-4)
    np.testing.assert_allclose(picked, (2 if x[0, 0, 0] > 0 else 6) * x[0], rtol=1e-6)
    jax.jit(replay(traced)).trace(spec).lower(lowering_platforms=("tpu",))
    assert len(calls) == 1  # neither running nor lowering called the Python again


def _matmul_program(precision):
    from jax.experimental import pallas as pl

    from evaluator.execution.program import TracedProgram

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32,
                             precision=precision)

    def kernel(x, y):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]),
                                                                   jnp.float32))(x, y)

    specs = [jax.ShapeDtypeStruct((256, 512), jnp.float32), jax.ShapeDtypeStruct((512, 256), jnp.float32)]
    return TracedProgram.trace(kernel, specs)


@pytest.mark.parametrize("precision,tpu_numerics,expect_bf16", [
    (None, True, True),                          # DEFAULT: the MXU takes f32 operands as bf16
    (jax.lax.Precision.HIGHEST, True, False),    # contract_precision<fp32>: full f32
    (None, False, False),                        # --exact-dots: the CPU's exact f32
])
def test_tpu_numerics_round_default_precision_dots_to_one_bf16_pass(precision, tpu_numerics, expect_bf16):
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.execution.program import replay

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = (rng.standard_normal((512, 256)) / np.sqrt(512)).astype(np.float32)
    run = jax.jit(replay(_matmul_program(precision), interpret=pltpu.InterpretParams(),
                         tpu_numerics=tpu_numerics))
    out = np.asarray(run(x, y), np.float64)
    # What one bf16 pass with f32 accumulation gives, computed here without Pallas.
    bf16 = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64) @ \
        np.asarray(jnp.asarray(y).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    exact = x.astype(np.float64) @ y.astype(np.float64)
    err_exact = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    if expect_bf16:
        assert np.linalg.norm(out - bf16) / np.linalg.norm(bf16) < 1e-5
        assert 1e-3 < err_exact < 5e-3  # the measured one-pass error, 2.35e-3
    else:
        assert err_exact < 1e-5


def test_the_verdict_says_which_numerics_it_used(evaluator):
    verdict = evaluator.grade("softmax", "no code here")
    assert verdict.details["numerics"].startswith("tpu-default-precision")


# Real code's layout: a module docstring with a fenced usage example (as in recurrentgemma's
# pallas.py) and the kernel called inside jax.shard_map (as in sglang-jax's fused MLP), here
# over a one-device mesh.
SHARD_MAPPED = '''"""Row softmax, sharded over the rows of a device mesh.

```python
y = kernel(x)  # x: [..., d]
```
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import Mesh, PartitionSpec as P


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)  # [br, d]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def rows_softmax(x):  # [rows, d]: this device's rows, in blocks of about 1 MiB (the last ragged)
    rows, d = x.shape
    cap = max(16, (1 << 20) // (x.dtype.itemsize * d) // 16 * 16)
    br = rows if rows <= cap else cap
    return pl.pallas_call(
        softmax_kernel, grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype))(x)


def kernel(x):
    mesh = Mesh(np.array(jax.devices()), ("rows",))
    flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
    sharded = jax.shard_map(rows_softmax, mesh=mesh, in_specs=P("rows", None),
                            out_specs=P("rows", None), check_vma=False)
    return sharded(flat).reshape(x.shape)
'''


def test_a_documented_module_calling_its_kernel_inside_shard_map_is_correct(evaluator):
    """Graded whole despite the fence in its docstring; the shard_map body is replayed."""
    verdict = evaluator.grade("softmax", SHARD_MAPPED, split="all", seed=2)
    assert verdict.status == "correct", verdict.message
    assert {c.split for c in verdict.cases} == {"train", "heldout"}


def _wrapped_programs():
    """One pallas_call (2x + 1) inside each higher-order primitive that real code puts around
    a kernel, by the primitive's name in the jaxpr."""
    from jax.custom_batching import custom_vmap
    from jax.experimental import pallas as pl
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import Mesh, PartitionSpec as P

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    def call(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))

    def sharded(x):  # collectives and the axis index need the mesh axis the replay rebuilds
        def local(y):
            z = call(y)
            return z + 0 * jax.lax.psum(z.sum(), "d") + jax.lax.axis_index("d").astype(z.dtype)
        return jax.shard_map(local, mesh=mesh, in_specs=P("d", None), out_specs=P("d", None),
                             check_vma=False)(x)

    vmapped = custom_vmap(call)
    vmapped.def_vmap(lambda axis_size, in_batched, x: (call(x), True))
    partitioned = custom_partitioning(call)
    partitioned.def_partition(
        partition=lambda mesh, args, result: (mesh, call, result.sharding, (args[0].sharding,)),
        sharding_rule="i j -> i j")
    return {
        "shard_map": sharded,
        "remat2": jax.checkpoint(call),
        "custom_vmap_call": vmapped,
        "custom_partitioning": partitioned,
        "scan": lambda x: jax.lax.scan(lambda c, _: (sharded(c), None), x, None, length=1)[0],
    }


@pytest.mark.parametrize("primitive", ["shard_map", "remat2", "custom_vmap_call",
                                       "custom_partitioning", "scan"])
def test_replay_rebuilds_the_primitives_real_code_wraps_around_kernels(primitive):
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.execution.program import TracedProgram, replay

    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    traced = TracedProgram.trace(_wrapped_programs()[primitive], [spec])
    assert [e.primitive.name for e in traced.closed.jaxpr.eqns] == [primitive]
    assert traced.replay_limits() == []
    x = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    out = jax.jit(replay(traced, interpret=pltpu.InterpretParams(detect_races=True)))(x)
    np.testing.assert_allclose(out, 2 * x + 1, rtol=1e-6)
    jax.jit(replay(traced)).trace(spec).lower(lowering_platforms=("tpu",))


def test_a_primitive_the_replay_cannot_rebuild_is_named_as_its_limit():
    """custom_linear_solve around a kernel: lowered for TPU as traced, but not run in interpret
    mode; the program says so before anything runs (the grader reports `grader_limit`)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.execution.program import ReplayLimit, TracedProgram, replay

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def solve(matvec, b):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(b.shape, b.dtype))(b)

    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    traced = TracedProgram.trace(
        lambda x: jax.lax.custom_linear_solve(lambda v: v, x, solve, symmetric=True), [spec])
    assert traced.replay_limits() == ["custom_linear_solve"]
    jax.jit(replay(traced)).trace(spec).lower(lowering_platforms=("tpu",))
    with pytest.raises(ReplayLimit, match="custom_linear_solve"):
        jax.jit(replay(traced, interpret=pltpu.InterpretParams()))(np.ones((8, 128), np.float32))


RESHAPED_DMA = '''
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _copy_rows(x_hbm, o_ref, buf, sem):
    tiles = o_ref.shape[0] * o_ref.shape[1] // 128
    copy = pltpu.make_async_copy(x_hbm.reshape(tiles, 128), buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...].reshape(o_ref.shape) * 2


def kernel(x):
    return pl.pallas_call(
        _copy_rows, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((x.size // 128, 128), x.dtype), pltpu.SemaphoreType.DMA])(x)
'''


def test_interpret_mode_failing_in_its_own_code_is_told_from_a_kernel_error():
    """jax's TPU interpret mode reads only indexers off a ref (its utils.to_range, "for now"), so a
    DMA from a reshaped ref raises AttributeError inside the interpreter: the grader's limit
    (`grader_limit`), where ejkernel's grouped matmul and tpu-inference's ragged paged attention,
    right on a v5e, got `runtime_error`. An AttributeError of the kernel's own stays its error."""
    from jax.experimental.pallas import tpu as pltpu

    from evaluator.candidate.errors import interpreter_fault

    def raised(source: str) -> Exception:
        namespace: dict = {}
        exec(compile(source, "candidate.py", "exec"), namespace)
        with pytest.raises(Exception) as info, pltpu.force_tpu_interpret_mode():
            jax.block_until_ready(jax.jit(namespace["kernel"])(jnp.ones((16, 256), jnp.float32)))
        return info.value

    assert interpreter_fault(raised(RESHAPED_DMA))
    own = RESHAPED_DMA.replace("o_ref[...] = buf[...]", "o_ref[...] = buf.no_such_field[...]")
    assert not interpreter_fault(raised(own))
