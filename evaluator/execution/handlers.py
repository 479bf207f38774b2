"""The worker's request handlers: one function per request type of evaluator/execution/protocol.py.

They run in the worker process (evaluator/execution/worker.py) on the candidate's code, one candidate
at a time; each takes the worker's state, the request and its arrays, and returns a reply
and arrays. They never see the reference or the expected outputs: the host compares.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
import types
from typing import Any, Callable

from evaluator.candidate.errors import (CANDIDATE_FILENAME, INTERPRETER_FAULT, compiler_message, describe_exception,
                                       interpreter_fault)
from evaluator.execution import jax_hooks
from evaluator.execution.program import INTERPRET_COMPILE_OPTIONS
from evaluator.execution.protocol import (Call, CaseSpec, Compile, Compiled, Costed, Done, Failed, Load, Lower, Ping,
                                          Pong, Ran, ReferenceCost, Reset, Returned, Run, SeedResult, Time, Timed,
                                          Trace, Traced, TracedCase)

# Candidates are registered in sys.modules as candidate_1, candidate_2, ... for their lifetime.
CANDIDATE_MODULE_PREFIX = "candidate_"
# Captured before any candidate runs: a candidate cannot swap the clock the timing uses.
_clock = time.perf_counter


@dataclasses.dataclass
class WorkerState:
    interpret: bool
    module: types.ModuleType | None = None
    source_lines: list[str] = dataclasses.field(default_factory=list)
    # Each case's program, traced once by `trace`; every later step runs this, never the
    # candidate's Python again (evaluator/execution/program.py).
    programs: dict[str, Any] = dataclasses.field(default_factory=dict)
    runners: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    topologies: dict[str, Any] = dataclasses.field(default_factory=dict)  # kept across candidates
    loaded: int = 0  # candidates loaded so far: each gets its own module name
    # Third-party reference modules (Call), by source: executed once, kept across candidates.
    external: dict[str, types.ModuleType] = dataclasses.field(default_factory=dict)


def handle(state: WorkerState, request: Any, arrays: list) -> tuple[Any, list]:
    """Dispatch one request to its handler."""
    handler = HANDLERS.get(type(request))
    if handler is None:
        return Failed("TypeError", f"no handler for {type(request).__name__}", internal=True), []
    return handler(state, request, arrays)


def _failed(exc: BaseException, state: WorkerState, **where: str) -> Failed:
    etype, text = describe_exception(exc, state.source_lines)
    return Failed(etype, text, **where)


def load(state: WorkerState, request: Load, arrays: list) -> tuple[Any, list]:
    """Execute the candidate as a real module: registered in sys.modules under a name of its
    own (until reset), so dataclasses, typing.get_type_hints and pickling find it."""
    state.source_lines = request.source.splitlines()
    jax_hooks.pretend_device_kind(request.device_kind)
    state.loaded += 1
    module = types.ModuleType(f"{CANDIDATE_MODULE_PREFIX}{state.loaded}")
    module.__file__ = CANDIDATE_FILENAME
    sys.modules[module.__name__] = module
    state.module = module
    try:
        code = compile(request.source, CANDIDATE_FILENAME, "exec")
        exec(code, module.__dict__)
    except BaseException as exc:  # SystemExit too: the candidate must not end the worker
        return _failed(exc, state), []
    if not callable(module.__dict__.get("kernel")):
        return Failed("NameError", "the module does not define a callable `kernel`"), []
    return Done(), []


def _specs(case: CaseSpec, sharding: Any = None) -> list:
    import jax
    import jax.numpy as jnp

    return [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)
            for shape, dtype in case.args]


def trace(state: WorkerState, request: Trace, arrays: list) -> tuple[Any, list]:
    """Trace kernel() once per case (cheap, so bench sizes too) and keep the program: what
    the host judges here is what every later step lowers, compiles, runs and times."""
    from evaluator.analysis.jaxpr_analysis import summarize
    from evaluator.analysis.provenance import kernel_origins
    from evaluator.execution.program import TracedProgram

    traced = []
    for case in request.cases:
        try:
            program = TracedProgram.trace(state.module.kernel, _specs(case))
        except Exception as exc:
            return _failed(exc, state, case=case.name), []
        state.programs[case.name] = program
        summary = summarize(program.closed, traffic=case.traffic,  # our code: bugs raise
                            arg_bounds=case.arg_bounds, first_parameter=case.first_parameter)
        traced.append(TracedCase(case.name, summary, kernel_origins(program.pallas_calls()),
                                 program.replay_limits()))
    return Traced(traced), []


def _replayed(state: WorkerState, case_name: str, interpret: Any = None,
              tpu_numerics: bool = False) -> Callable[..., Any]:
    import jax

    from evaluator.execution.program import replay

    if case_name not in state.programs:
        raise KeyError(f"case {case_name!r} was not traced before it was used")
    return jax.jit(replay(state.programs[case_name], interpret=interpret, tpu_numerics=tpu_numerics))


def lower(state: WorkerState, request: Lower, arrays: list) -> tuple[Any, list]:
    """Pallas -> Mosaic lowering for TPU (works without a TPU); compile on a real one."""
    for case in request.cases:
        phase, program = "lowering", _replayed(state, case.name)
        try:
            lowered = program.trace(*_specs(case)).lower(lowering_platforms=("tpu",))
            if request.compile:
                phase = "compile"
                lowered.compile()
        except Exception as exc:
            return _failed(exc, state, case=case.name, phase=phase), []
    return Done(), []


def compile_case(state: WorkerState, request: Compile, arrays: list) -> tuple[Any, list]:
    """Full libtpu compile of one case for a described TPU topology: no TPU needed. The same
    compile gives XLA's cost model of the program around the kernels (the speed prediction's glue)."""
    from evaluator.performance.xla_cost import read_compiled

    program = _replayed(state, request.case.name)
    try:
        compiled = _compile_for(state, request.topology, program, request.case)
    except Exception as exc:
        return Failed(type(exc).__name__, compiler_message(str(exc)), case=request.case.name), []
    stats = compiled.memory_analysis()
    fields = ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "temp_size_in_bytes", "alias_size_in_bytes")
    try:
        cost = dataclasses.asdict(read_compiled(compiled))
    except Exception:  # the compile stands; only the glue's price falls back to our count
        cost = None
    return Compiled({f: int(getattr(stats, f, 0) or 0) for f in fields}, cost), []


def reference_cost(state: WorkerState, request: ReferenceCost, arrays: list) -> tuple[Any, list]:
    """The reference compiled for a described TPU topology, read by XLA's cost model."""
    import jax

    from evaluator.performance.xla_cost import read_compiled

    fn = _reference(state, request)
    if isinstance(fn, Failed):
        return fn, []
    try:
        compiled = _compile_for(state, request.topology, jax.jit(fn), request.case)
    except Exception as exc:
        return Failed(type(exc).__name__, compiler_message(str(exc)), case=request.case.name), []
    return Costed(dataclasses.asdict(read_compiled(compiled))), []


def _compile_for(state: WorkerState, topology: str, program: Any, case: CaseSpec) -> Any:
    """`program` (a jitted function) compiled by libtpu for the first device of `topology`."""
    import jax
    from jax.sharding import SingleDeviceSharding

    if topology not in state.topologies:
        from jax.experimental import topologies

        state.topologies[topology] = topologies.get_topology_desc(topology_name=topology, platform="tpu")
    device = state.topologies[topology].devices[0]
    with jax.default_device(device):
        return program.trace(*_specs(case, SingleDeviceSharding(device))).lower().compile()


# The interpret-mode checks a seed runs under: every check TPU interpret mode has (the race
# detector, out-of-bounds reads raised, uninitialised memory poisoned with NaN), or all but the
# race detector, which costs most on kernels that touch memory often (a per-step scan: 17.8 s
# against 2.8 s per seed; docs/architecture.md, "Grading speed").
FULL_CHECKS = "full"
CHEAP_CHECKS = "no race detection"


def run(state: WorkerState, request: Run, arrays: list) -> tuple[Any, list]:
    """Run one case's traced program on each seed's inputs; outputs go back as numpy arrays.

    Out-of-bounds reads raise and uninitialised memory is NaN on every seed. The race
    detector runs where a race can happen: with one core, only a kernel's own DMAs run beside
    it (the pipeline's block copies are the core's own accesses), so a case whose kernels start
    none runs without it. Otherwise the first seed runs with it, and the others without it when
    `request.seed_checks` asks ("cheap"), or ("auto") when the first seed's run took longer
    than its compile: the second program's compile (about half the first's) is then repaid at
    once. `seed_checks="full"` runs it on every seed of every case. A race is a property of the
    access pattern, which the first seed ran; benchmarks/seed_checks_agreement.py measures that
    the verdicts agree."""
    import jax
    import numpy as np

    nargs = request.nargs
    outputs, results, compile_s = [], [], 0.0
    checks = FULL_CHECKS if request.races_possible or request.seed_checks == "full" else CHEAP_CHECKS
    jax_hooks.take_races(), jax_hooks.take_unwaited()
    for s in range(len(arrays) // nargs):
        inputs = arrays[s * nargs:(s + 1) * nargs]
        if (s == 1 and checks == FULL_CHECKS and state.interpret
                and _cheap_after(request.seed_checks, results[0], compile_s)):
            checks = CHEAP_CHECKS
        try:
            program, seconds = _compiled(state, request.case, request.tpu_numerics, checks, inputs)
            compile_s += seconds
            start = time.perf_counter()
            out = jax.block_until_ready(program(*inputs))
            elapsed = time.perf_counter() - start
            leaves = jax.tree_util.tree_leaves(out)
            host = [np.array(leaf) for leaf in leaves]  # copies off the device
        except Exception as exc:
            etype, text = describe_exception(exc, state.source_lines)
            if interpreter_fault(exc):  # the grader's limit (stages: grader_limit), not the kernel's
                etype = INTERPRETER_FAULT
            results.append(SeedResult(False, etype, text, checks=checks))
            break
        finally:
            jax_hooks.reset_interpret_state()
        if jax_hooks.take_races():
            results.append(SeedResult(False, "DataRace", "TPU interpret mode detected a data race: "
                                      "two accesses to one buffer (at least one a write) not "
                                      "ordered by a DMA wait or semaphore.", checks=checks))
            break
        if unwaited := jax_hooks.take_unwaited():
            results.append(SeedResult(False, "UnwaitedDMA", "a kernel returned with a DMA or semaphore "
                                      f"signal nobody waited for ({unwaited[0]}): on a TPU that copy "
                                      "is still in flight after the kernel ends. Wait on every copy "
                                      "you start (a prefetch past the last step is one never waited).",
                                      checks=checks))
            break
        bad = [type(leaf).__name__ for leaf in leaves if not hasattr(leaf, "shape")]
        results.append(SeedResult(True, n_outputs=len(host), non_arrays=bad,
                                  tree=str(jax.tree_util.tree_structure(out)),
                                  seconds=elapsed, checks=checks))
        outputs.extend(host)
    return Ran(results, compile_s), outputs


def _cheap_after(seed_checks: str, first: SeedResult, compile_s: float) -> bool:
    """Whether the seeds after the first run without the race detector (see run)."""
    if seed_checks == "cheap":
        return first.ok
    return seed_checks == "auto" and first.ok and first.seconds > compile_s


def _compiled(state: WorkerState, case_name: str, tpu_numerics: bool, checks: str,
              inputs: list) -> tuple[Callable[..., Any], float]:
    """The case's traced program compiled for these inputs' shapes (once per case, numerics
    and checks), and the seconds that took (0 when it was already compiled)."""
    key = f"{case_name}|{tpu_numerics}|{checks if state.interpret else ''}"
    if key in state.runners:
        return state.runners[key], 0.0
    start = time.perf_counter()
    interpret = None
    if state.interpret:
        from jax.experimental.pallas import tpu as pltpu

        interpret = pltpu.InterpretParams(detect_races=checks == FULL_CHECKS, out_of_bounds_reads="raise",
                                          uninitialized_memory="nan")
    lowered = _replayed(state, case_name, interpret, tpu_numerics).lower(*inputs)
    state.runners[key] = lowered.compile(INTERPRET_COMPILE_OPTIONS if state.interpret else None)
    return state.runners[key], time.perf_counter() - start


def time_case(state: WorkerState, request: Time, arrays: list) -> tuple[Any, list]:
    """Stage 8 on real hardware: wall times of the kernel and of the XLA reference on the same
    inputs (sent by the host), each called as a user would: the case's own dtypes.

    The kernel's outputs from the timed runs come back so the host can check them at this
    size before the speedup counts (a kernel could be right only where it is compared).
    """
    import jax
    import numpy as np

    fn = _reference(state, request)
    if isinstance(fn, Failed):
        return fn, []
    inputs = [jax.device_put(a) for a in arrays]
    runner, _ = _compiled(state, request.case, request.tpu_numerics, FULL_CHECKS, inputs)
    reference = jax.jit(fn)
    kernel_s = time_callable(runner, inputs, request.warmup, request.iters)
    reference_s = time_callable(reference, inputs, request.warmup, request.iters)
    outputs = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(runner(*inputs))]
    return Timed(kernel_s, reference_s), outputs


def _reference(state: WorkerState, request: Time | ReferenceCost) -> Callable[..., Any] | Failed:
    """The task's reference: ours by name, or an imported task's built by its driver."""
    if request.reference_source is None:
        import tasks

        return tasks.get_task(request.task).reference
    driver = driver_function(request.reference_function or "")
    if isinstance(driver, Failed):
        return driver
    try:
        return driver(external_module(state, request.reference_source), *request.reference_args)
    except Exception as exc:
        return Failed(*describe_exception(exc))


def time_callable(fn: Callable[..., Any], inputs: list, warmup: int, iters: int) -> list[float]:
    """Raw per-call wall times; block_until_ready, or we would time only the dispatch."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*inputs))
    samples = []
    for _ in range(iters):
        start = _clock()
        jax.block_until_ready(fn(*inputs))
        samples.append(_clock() - start)
    return samples


# A module whose functions a Call may name says so with this attribute set to True: our own drivers
# of third-party code (an adapter's, named by the adapter's requests), nothing else.
DRIVER_MARK = "REFERENCE_DRIVER"
EXTERNAL_MODULE_PREFIX = "external_reference_"


def driver_function(name: str) -> Callable[..., Any] | Failed:
    """`package.module:function` of a module that marks itself a driver; Failed for any other."""
    import importlib

    module_name, _, function = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    if getattr(module, DRIVER_MARK, False) is not True or not callable(getattr(module, function, None)):
        return Failed("ValueError", f"{name} is not a driver function", internal=True)
    return getattr(module, function)


def external_module(state: WorkerState, source: str) -> types.ModuleType:
    """A peer suite's file executed as a module of its own, once per source (kept for later calls)."""
    module = state.external.get(source)
    if module is None:
        module = types.ModuleType(f"{EXTERNAL_MODULE_PREFIX}{len(state.external) + 1}")
        module.__file__ = "<reference>"
        sys.modules[module.__name__] = module  # dataclasses in their code look it up
        exec(compile(source, "<reference>", "exec"), module.__dict__)
        state.external[source] = module
    return module


def call_external(state: WorkerState, request: Call, arrays: list) -> tuple[Any, list]:
    """Execute a peer suite's file as a module (once per source) and call one of our driver
    functions on it; the driver returns (JSON-able value, arrays). Their code failing is a
    Failed reply, not an evaluator bug: the host reports which file could not be used."""
    import numpy as np

    driver = driver_function(request.function)
    if isinstance(driver, Failed):
        return driver, []
    try:
        value, out = driver(external_module(state, request.source), *request.args, *arrays)
    except Exception as exc:
        etype, text = describe_exception(exc)
        return Failed(etype, text), []
    return Returned(value), [np.asarray(a) for a in out]


def reset(state: WorkerState, request: Reset, arrays: list) -> tuple[Any, list]:
    """Forget the candidate: its module (and its sys.modules entry), traced programs,
    interpret state and temp files.

    JAX's caches are kept on purpose: entries are keyed by function objects, so the next
    candidate cannot hit the last one's, and clearing them (plus a full gc) tripled the cost
    of grading a small candidate. The pool recycles workers every few hundred jobs instead.
    """
    if state.module is not None:
        sys.modules.pop(state.module.__name__, None)
    state.module, state.source_lines = None, []
    state.programs.clear()
    state.runners.clear()
    jax_hooks.pretend_device_kind(None)
    jax_hooks.reset_interpret_state()
    cwd = os.getcwd()
    for name in os.listdir(cwd):
        path = os.path.join(cwd, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
    return Done(), []


def ping(state: WorkerState, request: Ping, arrays: list) -> tuple[Any, list]:
    return Pong(request.echo), list(arrays)


HANDLERS: dict[type, Callable[[WorkerState, Any, list], tuple[Any, list]]] = {
    Load: load, Trace: trace, Lower: lower, Compile: compile_case, ReferenceCost: reference_cost, Run: run,
    Time: time_case,
    Call: call_external, Reset: reset, Ping: ping,
}
