"""The host-worker contract: one dataclass per request and per reply, and their codec.

The host (evaluator/stages.py, via evaluator/execution/sandbox.py) sends a request and gets its reply
or a `Failed`; the worker (evaluator/execution/handlers.py) reads the same classes. On the wire each
message is a JSON header `{"type": <class name>, ...fields}` plus raw arrays
(evaluator/execution/wire.py): decoding builds only these dataclasses and plain values, never objects
named by the peer, so a worker running untrusted code cannot make the host execute anything.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from evaluator.analysis.jaxpr_analysis import TraceSummary
from evaluator.analysis.provenance import KernelOrigin
from evaluator.execution.wire import ProtocolError


@dataclass
class CaseSpec:
    """A case as a worker needs it to trace, lower or compile: argument shapes and dtypes,
    and inclusive bounds of integer inputs (so data-dependent loops count at their maximum)."""

    name: str
    args: list[tuple[list[int], str]]
    arg_bounds: list[tuple[int, int] | None] | None = None
    traffic: bool = False  # bench sizes: also the traffic analysis the performance model needs
    # Index of kernel()'s first parameter (weights) argument, None when the task declares none:
    # work on parameters alone is weight preprocessing, not outside work (parameter_work.py).
    first_parameter: int | None = None


# --- requests -------------------------------------------------------------------------------
@dataclass
class Load:
    """Execute the candidate's source as a module; `device_kind` is the TPU that Pallas code
    asking "which chip is this?" should hear (None on a TPU host)."""

    source: str
    device_kind: str | None = None


@dataclass
class Trace:
    cases: list[CaseSpec]


@dataclass
class Lower:
    cases: list[CaseSpec]
    compile: bool = False  # also compile (a real TPU host)


@dataclass
class Compile:
    """libtpu compile of one traced case for a described topology (no TPU needed)."""

    topology: str
    case: CaseSpec


@dataclass
class ReferenceCost:
    """libtpu compile of the task's reference at one case for a described topology, for XLA's
    cost model's figures. The reference is found as Time finds it."""

    task: str
    case: CaseSpec
    topology: str
    reference_source: str | None = None
    reference_function: str | None = None
    reference_args: list[Any] = field(default_factory=list)


# Where interpret mode's race detector runs (evaluator/execution/handlers.py, run): "full" on every seed
# of every case; "auto" on the first seed of a case whose kernels start DMAs (nothing else can
# race), and on its other seeds too unless dropping it is cheaper than the compile it costs;
# "cheap" never after the first seed.
SEED_CHECKS = ("full", "auto", "cheap")


@dataclass
class Run:
    """Run a traced case on `len(arrays) // nargs` seeds' inputs (the arrays, in order)."""

    case: str
    nargs: int
    tpu_numerics: bool = False
    seed_checks: str = "auto"
    races_possible: bool = True  # a kernel of the case starts DMAs (jaxpr_analysis.RACE_PRIMITIVES)


@dataclass
class Time:
    """Time the case's kernel and the task's reference on the same inputs (the arrays). The
    reference is our task's (`task`, by name), or for an imported task the function that a driver
    function (`reference_function`, as in Call) builds from `reference_source` and `reference_args`."""

    task: str
    case: str
    warmup: int
    iters: int
    tpu_numerics: bool = False
    reference_source: str | None = None
    reference_function: str | None = None
    reference_args: list[Any] = field(default_factory=list)


@dataclass
class Call:
    """Run third-party reference code (a peer suite's workload or model, suites/): execute
    `source` as a module of its own, kept for later calls with the same source, and call our
    `function` ("package.module:name", e.g. suites.driver:describe) with that module, `args`
    and the arrays. It runs here, in a sandboxed worker, because it is nobody's trusted code."""

    source: str
    function: str
    args: list[Any] = field(default_factory=list)


@dataclass
class Reset:
    """Forget the candidate."""


@dataclass
class Ping:
    echo: Any = None


# --- replies --------------------------------------------------------------------------------
@dataclass
class Failed:
    """The request failed. `internal`: the evaluator's own code failed (a bug, raised on the
    host, never a verdict); otherwise the candidate's code did."""

    error_type: str
    error: str
    case: str | None = None  # which case, for requests over several
    phase: str | None = None  # Lower: "lowering" or "compile"
    internal: bool = False


@dataclass
class Ready:
    pid: int
    jax: str
    isolation: dict[str, bool] = field(default_factory=dict)


@dataclass
class Refused:
    """The worker cannot serve at all (e.g. a jax hook it needs is gone): an evaluator bug."""

    error: str


@dataclass
class Done:
    """A request that succeeded with nothing to say (Load, Lower, Reset)."""


@dataclass
class TracedCase:
    case: str
    summary: TraceSummary
    origins: list[KernelOrigin]
    # Primitives around a pallas_call that the interpret-mode replay cannot rebuild yet
    # (evaluator/execution/program.py: TracedProgram.replay_limits); empty for most programs.
    replay_limits: list[str] = field(default_factory=list)


@dataclass
class Traced:
    cases: list[TracedCase]


@dataclass
class Compiled:
    memory: dict[str, int]  # the compiler's memory statistics, bytes
    # What XLA's cost model says of the candidate's program (XlaProgramCost's fields): its glue,
    # the Pallas kernels being custom calls it prices at zero (or at their declared cost)
    cost: dict[str, Any] | None = None


@dataclass
class Costed:
    cost: dict[str, Any]  # evaluator.performance.xla_cost.XlaProgramCost's fields


@dataclass
class SeedResult:
    """One seed of a Run: `n_outputs` arrays follow in the reply's arrays when ok."""

    ok: bool
    error_type: str | None = None
    error: str | None = None
    n_outputs: int = 0
    non_arrays: list[str] = field(default_factory=list)  # type names of leaves that are not arrays
    tree: str = ""  # the output's pytree structure, for feedback
    seconds: float = 0.0  # executing the compiled program on this seed's inputs
    checks: str = "full"  # the interpret-mode checks it ran under (handlers.CHECKS)


@dataclass
class Ran:
    results: list[SeedResult]
    compile_s: float = 0.0  # tracing and compiling the program(s) the seeds ran


@dataclass
class Timed:
    """Per-call wall times; the kernel's outputs of the timed inputs follow as arrays."""

    kernel_s: list[float]
    reference_s: list[float]


@dataclass
class Returned:
    """A Call's result: a JSON-able value; its arrays follow in the reply's arrays."""

    value: Any = None


@dataclass
class Pong:
    echo: Any = None


Request = Union[Load, Trace, Lower, Compile, ReferenceCost, Run, Time, Call, Reset, Ping]
Reply = Union[Failed, Ready, Refused, Done, Traced, Compiled, Costed, Ran, Timed, Returned, Pong]
MESSAGES: dict[str, type] = {cls.__name__: cls for cls in (*typing.get_args(Request), *typing.get_args(Reply))}


def to_header(message: Any) -> dict[str, Any]:
    """A message as a JSON-able header."""
    if type(message).__name__ not in MESSAGES:
        raise TypeError(f"{type(message).__name__} is not a protocol message")
    return {"type": type(message).__name__, **_plain(message)}


def from_header(header: dict[str, Any]) -> Any:
    """The message a header encodes; ProtocolError for anything else."""
    header = dict(header)
    cls = MESSAGES.get(header.pop("type", None))
    if cls is None:
        raise ProtocolError(f"unknown message type in {sorted(header)[:5]}")
    try:
        return _build(cls, header)
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _build(tp: Any, value: Any) -> Any:
    """`value` (decoded JSON) as an instance of the type annotation `tp`."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp) if f.init}
        extra = set(value) - known
        if extra:
            raise TypeError(f"unexpected fields {sorted(extra)}")
        return tp(**{name: _build(hints[name], v) for name, v in value.items()})
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        return _build(next(a for a in args if a is not type(None)), value)
    if origin is list:
        return [_build(args[0], v) for v in value]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        if len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return tuple(_build(a, v) for a, v in zip(args, value))
    if origin is dict:
        return {k: _build(args[1], v) for k, v in value.items()}
    return value
