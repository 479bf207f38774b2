"""The worker process: runs untrusted candidate code on request, one candidate at a time.

Started by evaluator/sandbox.py as `python -m evaluator.worker`. It imports JAX once and then
serves requests (load, trace, lower, compile, run, time, reset) over its stdin/stdout pipes, so many
candidates share one start-up. It never sees the reference or the expected outputs: the host
compares results. Anything the candidate prints goes to the worker's log, not the pipe.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import sys
import time
import types
from typing import Any, Callable

from evaluator.errors import CANDIDATE_FILENAME, describe_exception

# Candidates are registered in sys.modules as candidate_1, candidate_2, ... for their lifetime.
CANDIDATE_MODULE_PREFIX = "candidate_"

_RACES: list[str] = []
# Captured before any candidate runs: a candidate cannot swap the clock the timing uses.
_clock = time.perf_counter


def main() -> None:
    args = _parse_args()
    _limit_resources(args.memory_gb)
    isolation = _isolate(args.read_only, network=args.platform != "tpu")
    proto_in, proto_out = _take_protocol_pipes()
    os.environ["JAX_PLATFORMS"] = args.platform
    import numpy as np  # noqa: F401  (warm imports before "ready")
    import jax

    from evaluator import protocol

    if args.platform == "cpu":
        jax.config.update("jax_platforms", "cpu")
    state = _WorkerState(interpret=args.interpret)
    try:
        _install_race_recorder()
    except HookError as exc:  # an evaluator that cannot see races must not grade at all
        protocol.write_message(proto_out, {"ready": False, "internal": True, "error": str(exc)})
        return
    protocol.write_message(proto_out, {"ready": True, "pid": os.getpid(),
                                       "jax": jax.__version__, "isolation": isolation})
    while True:
        try:
            header, arrays = protocol.read_message(proto_in)
        except protocol.PeerClosed:
            return
        handler = _HANDLERS.get(header.get("cmd", ""))
        if handler is None:
            protocol.write_message(proto_out, {"ok": False, "internal": True, "error_type": "KeyError",
                                               "error": f"unknown command {header.get('cmd')!r}"})
            continue
        try:
            reply, out_arrays = handler(state, header, arrays)
        except Exception as exc:  # a bug in the evaluator: reply, never hang; the host raises
            etype, text = describe_exception(exc)
            reply, out_arrays = {"ok": False, "internal": True, "error_type": etype,
                                 "error": text}, []
        protocol.write_message(proto_out, reply, out_arrays)


@dataclasses.dataclass
class _WorkerState:
    interpret: bool
    module: types.ModuleType | None = None
    source_lines: list[str] = dataclasses.field(default_factory=list)
    # Each case's program, traced once by `trace`; every later step runs this, never the
    # candidate's Python again (evaluator/program.py).
    programs: dict[str, Any] = dataclasses.field(default_factory=dict)
    runners: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    topologies: dict[str, Any] = dataclasses.field(default_factory=dict)  # kept across candidates
    loaded: int = 0  # candidates loaded so far: each gets its own module name


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--platform", default="cpu")
    p.add_argument("--interpret", action="store_true")
    p.add_argument("--memory-gb", type=float, default=0)
    p.add_argument("--read-only", action="append", default=[],
                   help="a directory to make read-only for this worker (repeatable)")
    return p.parse_args()


# A backstop against a runaway worker outliving its host: per-step wall-clock limits bound
# each candidate, and the pool recycles a worker every few hundred candidates.
WORKER_CPU_SECONDS = 4 * 3600


def _limit_resources(memory_gb: float) -> None:
    """Address-space cap (allocations past it fail inside the worker, not on the host) and
    a lifetime CPU-time cap."""
    if memory_gb > 0:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (WORKER_CPU_SECONDS, WORKER_CPU_SECONDS))


_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def _isolate(read_only: list[str], network: bool = True) -> dict[str, bool]:
    """Best effort, before any candidate runs: a network namespace with no interfaces up
    (no network at all, loopback included) and read-only views of `read_only` directories
    (a private mount namespace). Needs root or user namespaces; where the system refuses,
    the worker runs without them and says so (the static policy still refuses network,
    process and file modules). On a TPU host the network stays: libtpu may need it."""
    import ctypes

    done = {"network": False, "read_only": False}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return done
    if network and libc.unshare(_CLONE_NEWNET) == 0:
        done["network"] = True
    if read_only and libc.unshare(_CLONE_NEWNS) == 0 and \
            libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0:
        ok = True
        for path in read_only:
            p = os.fsencode(path)
            ok &= libc.mount(p, p, None, _MS_BIND | _MS_REC, None) == 0 and \
                libc.mount(p, p, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) == 0
        done["read_only"] = bool(ok)
    return done


def _take_protocol_pipes():
    """Keep private copies of stdin/stdout for the protocol; point fd 0/1 elsewhere."""
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # candidate prints land in the worker log
    sys.stdout = os.fdopen(1, "w", buffering=1)
    return proto_in, proto_out


class HookError(RuntimeError):
    """A private jax hook the worker relies on is gone (a jax upgrade): fail loudly."""


def _install_race_recorder() -> None:
    """Interpret mode only prints races; record them so a race becomes a verdict."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

        base = ipc.RaceDetectionState
    except (ImportError, AttributeError) as exc:
        raise HookError("cannot record data races: jax._src.pallas.mosaic.interpret."
                        f"interpret_pallas_call.RaceDetectionState is gone ({exc}); the evaluator "
                        f"needs updating for jax {_jax_version()}") from None
    if "races_found" not in {f.name for f in dataclasses.fields(base)}:
        raise HookError("cannot record data races: RaceDetectionState no longer has races_found; "
                        f"the evaluator needs updating for jax {_jax_version()}")

    class RecordingRaceState(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "races_found" and value:
                _RACES.append("race")
            super().__setattr__(name, value)

    ipc.RaceDetectionState = RecordingRaceState


def _jax_version() -> str:
    import jax

    return jax.__version__


# --- request handlers: (state, header, arrays) -> (reply, arrays) ---------------------------

def _load(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Execute the candidate as a real module: registered in sys.modules under a name of its
    own (until reset), so dataclasses, typing.get_type_hints and pickling find it."""
    source = header["source"]
    state.source_lines = source.splitlines()
    _pretend_device_kind(header.get("device_kind"))
    state.loaded += 1
    module = types.ModuleType(f"{CANDIDATE_MODULE_PREFIX}{state.loaded}")
    module.__file__ = CANDIDATE_FILENAME
    sys.modules[module.__name__] = module
    state.module = module
    try:
        code = compile(source, CANDIDATE_FILENAME, "exec")
        exec(code, module.__dict__)
    except BaseException as exc:  # SystemExit too: the candidate must not end the worker
        etype, text = describe_exception(exc, state.source_lines)
        return {"ok": False, "error_type": etype, "error": text}, []
    if not callable(module.__dict__.get("kernel")):
        return {"ok": False, "error_type": "NameError",
                "error": "the module does not define a callable `kernel`"}, []
    return {"ok": True}, []


def _specs(case: dict, sharding: Any = None) -> list:
    import jax
    import jax.numpy as jnp

    return [jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)
            for shape, dtype in case["args"]]


def _trace(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Trace kernel() once per case (cheap, so bench sizes too) and keep the program: what
    the host judges here is what every later step lowers, compiles, runs and times."""
    from evaluator.jaxpr_analysis import summarize
    from evaluator.program import TracedProgram
    from evaluator.provenance import kernel_origins

    summaries = []
    for case in header["cases"]:
        try:
            program = TracedProgram.trace(state.module.kernel, _specs(case))
        except Exception as exc:
            etype, text = describe_exception(exc, state.source_lines)
            return {"ok": False, "case": case["name"], "error_type": etype, "error": text}, []
        state.programs[case["name"]] = program
        summary = summarize(program.closed, traffic=case.get("traffic", False),  # our code: bugs raise
                            arg_bounds=case.get("arg_bounds"))
        origins = kernel_origins(program.pallas_calls())
        summaries.append({"case": case["name"], **dataclasses.asdict(summary),
                          "origins": [dataclasses.asdict(o) for o in origins]})
    return {"ok": True, "summaries": summaries}, []


def _replayed(state: _WorkerState, case_name: str, interpret: Any = None,
              tpu_numerics: bool = False) -> Callable[..., Any]:
    import jax

    from evaluator.program import replay

    if case_name not in state.programs:
        raise KeyError(f"case {case_name!r} was not traced before it was used")
    return jax.jit(replay(state.programs[case_name], interpret=interpret, tpu_numerics=tpu_numerics))


def _lower(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Pallas -> Mosaic lowering for TPU (works without a TPU); compile on a real one."""
    for case in header["cases"]:
        phase, program = "lowering", _replayed(state, case["name"])
        try:
            lowered = program.trace(*_specs(case)).lower(lowering_platforms=("tpu",))
            if header.get("compile"):
                phase = "compile"
                lowered.compile()
        except Exception as exc:
            etype, text = describe_exception(exc, state.source_lines)
            return {"ok": False, "phase": phase, "case": case["name"],
                    "error_type": etype, "error": text}, []
    return {"ok": True}, []


def _compile(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Full libtpu compile of one case for a described TPU topology: no TPU needed."""
    import jax
    from jax.sharding import SingleDeviceSharding

    topology = header["topology"]
    if topology not in state.topologies:
        from jax.experimental import topologies

        state.topologies[topology] = topologies.get_topology_desc(topology_name=topology,
                                                                  platform="tpu")
    device = state.topologies[topology].devices[0]
    case = header["case"]
    program = _replayed(state, case["name"])
    try:
        with jax.default_device(device):
            compiled = program.trace(*_specs(case, SingleDeviceSharding(device))).lower().compile()
    except Exception as exc:
        return {"ok": False, "error_type": type(exc).__name__,
                "error": compiler_message(str(exc))}, []
    stats = compiled.memory_analysis()
    fields = ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "temp_size_in_bytes", "alias_size_in_bytes")
    return {"ok": True, "memory": {f: int(getattr(stats, f, 0) or 0) for f in fields}}, []


def compiler_message(text: str, max_lines: int = 4) -> str:
    """The compiler's useful lines first: drop status prefixes and boilerplate."""
    lines = []
    for raw in text.strip().splitlines():
        line = raw.strip()
        for prefix in ("RESOURCE_EXHAUSTED:", "INTERNAL:", "INVALID_ARGUMENT:", "UNKNOWN:",
                       "XLA:TPU compile permanent error.", "Mosaic failed to compile TPU kernel:"):
            if line.startswith(prefix):
                line = line[len(prefix):].strip()
        if line and not line.startswith(("===", "Traceback", "File ")):
            lines.append(line if len(line) <= 200 else line[:197] + "...")
        if len(lines) >= max_lines:
            break
    return " | ".join(lines)[:700]


_SAVED_DEVICE_QUERIES: tuple | None = None


def _pretend_device_kind(device_kind: str | None) -> None:
    """Make Pallas code that asks "which TPU is this?" see the target chip, until reset.

    Some lowering rules (rank-1 blocks, `//` in index maps, sign) and emit_pipeline's tiling
    query the default device, which is the CPU here, and fail with "Unsupported TPU device
    kind: cpu". Only the answer to that question changes; interpret mode is still chosen by
    its own flag. On a TPU host (device_kind None) nothing is changed.
    """
    global _SAVED_DEVICE_QUERIES
    from jax._src.pallas.mosaic import tpu_info

    if _SAVED_DEVICE_QUERIES is None:
        _SAVED_DEVICE_QUERIES = (tpu_info.get_device_kind, tpu_info.get_num_device_cores)
    if device_kind:
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = (lambda: device_kind), (lambda: 1)
    else:
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = _SAVED_DEVICE_QUERIES


def _run(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Run one case's traced program on each seed's inputs; outputs go back as numpy arrays."""
    import jax
    import numpy as np

    nargs = header["nargs"]
    runner = _case_runner(state, header["case"], header.get("tpu_numerics", False))
    outputs, results = [], []
    for s in range(len(arrays) // nargs):
        inputs = arrays[s * nargs:(s + 1) * nargs]
        del _RACES[:]
        start = time.perf_counter()
        try:
            out = jax.block_until_ready(runner(*inputs))
            leaves = jax.tree_util.tree_leaves(out)
            host = [np.array(leaf) for leaf in leaves]  # copies off the device
        except Exception as exc:
            etype, text = describe_exception(exc, state.source_lines)
            results.append({"ok": False, "error_type": etype, "error": text})
            break
        finally:
            _reset_interpret_state()
        if _RACES:
            results.append({"ok": False, "error_type": "DataRace", "error":
                            "TPU interpret mode detected a data race: two accesses to one buffer "
                            "(at least one a write) not ordered by a DMA wait or semaphore."})
            break
        bad = [type(leaf).__name__ for leaf in leaves if not hasattr(leaf, "shape")]
        results.append({"ok": True, "n_outputs": len(host), "non_arrays": bad,
                        "tree": str(jax.tree_util.tree_structure(out)),
                        "seconds": time.perf_counter() - start})
        outputs.extend(host)
    return {"ok": True, "results": results}, outputs


def _case_runner(state: _WorkerState, case_name: str, tpu_numerics: bool = False) -> Callable[..., Any]:
    """The case's traced program, jitted once; under the evaluator's TPU interpret mode when
    this backend interprets (every pallas_call re-issued with these parameters), with dots
    computed as the TPU computes them when `tpu_numerics` (evaluator/program.py)."""
    key = f"{case_name}|{tpu_numerics}"
    if key not in state.runners:
        interpret = None
        if state.interpret:
            from jax.experimental.pallas import tpu as pltpu

            interpret = pltpu.InterpretParams(detect_races=True, out_of_bounds_reads="raise",
                                              uninitialized_memory="nan")
        state.runners[key] = _replayed(state, case_name, interpret, tpu_numerics)
    return state.runners[key]


def _reset_interpret_state() -> None:
    try:
        from jax.experimental.pallas import tpu as pltpu

        pltpu.reset_tpu_interpret_mode_state()
    except Exception:
        pass


def _time(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    """Stage 8 on real hardware: wall times of the kernel and of the XLA reference on the same
    inputs (sent by the host), each called as a user would: the case's own dtypes.

    The kernel's outputs from the timed runs come back so the host can check them at this
    size before the speedup counts (a kernel could be right only where it is compared).
    """
    import jax
    import numpy as np

    import tasks

    task = tasks.get_task(header["task"])
    inputs = [jax.device_put(a) for a in arrays]
    runner = _case_runner(state, header["case"], header.get("tpu_numerics", False))
    reference = jax.jit(task.reference)
    kernel_s = time_callable(runner, inputs, header["warmup"], header["iters"])
    reference_s = time_callable(reference, inputs, header["warmup"], header["iters"])
    outputs = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(runner(*inputs))]
    return {"ok": True, "kernel_s": kernel_s, "reference_s": reference_s}, outputs


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


def _reset(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
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
    _pretend_device_kind(None)
    _reset_interpret_state()
    cwd = os.getcwd()
    for name in os.listdir(cwd):
        path = os.path.join(cwd, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
    return {"ok": True}, []


def _ping(state: _WorkerState, header: dict, arrays: list) -> tuple[dict, list]:
    return {"ok": True, "echo": header.get("echo")}, list(arrays)


_HANDLERS = {"load": _load, "trace": _trace, "lower": _lower, "compile": _compile, "run": _run,
             "time": _time,
             "reset": _reset, "ping": _ping}

if __name__ == "__main__":
    main()
