"""Whose kernel is it? Every pallas_call's body must be the candidate's own code.

A task asks for a written kernel; `from jax.experimental.pallas.ops.tpu.matmul import matmul`
is the Pallas twin of calling cuBLAS. Two facts in the traced program tell them apart:
- the kernel body's function: its jaxpr's debug info names the function and the file and
  line that define it ("matmul_kernel at .../pallas/ops/tpu/matmul.py:28");
- the body's equations: each carries the traceback of the Python that emitted it, so a
  three-line body in the candidate that calls a library's kernel function still shows the
  library's file as the innermost frame that is not jax's own machinery.
The body's share is weighed by work, not counted in equations: only what reaches the outputs,
at its cost (evaluator/analysis/live_work.py), so dead padding of our own cannot outvote the library.
Honest wrappers (functools.partial, functools.wraps, closures) keep the candidate's file in
both places. Runs in the worker, on the jaxpr it traced; returns plain data.
"""
from __future__ import annotations

import functools
import os
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Iterator

from evaluator.analysis.jaxpr_walk import sub_jaxprs
from evaluator.analysis.live_work import live_work
from evaluator.candidate.errors import CANDIDATE_FILENAME

# Library kernels inside jax: not machinery, someone's finished kernel.
_JAX_KERNEL_LIBRARY = os.sep + os.path.join("jax", "experimental", "pallas", "ops") + os.sep


@dataclass
class KernelOrigin:
    """Where one pallas_call's kernel comes from, and how it was traced."""

    name: str  # the kernel body's function name
    defined_in: str  # "candidate", or the library file (package-relative) that defines the body
    line: int | None
    own_equations: int  # body equations emitted by the candidate's code
    library_equations: dict[str, int] = field(default_factory=dict)  # library file -> equations
    interpret: str | None = None  # the interpret= it was traced with, when truthy
    # The work of the equations that reach the outputs (evaluator/analysis/live_work.py): FLOPs and
    # transcendentals per grid step, and the bytes they touch, the candidate's and each library's.
    own_work: float = 0.0
    library_work: dict[str, float] = field(default_factory=dict)
    own_bytes: float = 0.0
    library_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def library_share(self) -> float:
        """The libraries' share of the body's live work; of its live bytes where it computes
        nothing (a pure copy); of its equations where neither is known."""
        for own, foreign in ((self.own_work, self.library_work), (self.own_bytes, self.library_bytes),
                             (self.own_equations, self.library_equations)):
            total = own + sum(foreign.values())
            if total:
                return sum(foreign.values()) / total
        return 0.0

    @property
    def main_library(self) -> str | None:
        for weights in (self.library_work, self.library_bytes, self.library_equations):
            if any(weights.values()):
                return max(weights.items(), key=lambda kv: kv[1])[0]
        return None


def kernel_origins(pallas_eqns: list[Any]) -> list[KernelOrigin]:
    return [_origin_of(eqn) for eqn in pallas_eqns]


def _origin_of(eqn: Any) -> KernelOrigin:
    kernel_jaxpr = eqn.params["jaxpr"]
    src = getattr(getattr(kernel_jaxpr, "debug_info", None), "func_src_info", None) or ""
    name, _, where = src.partition(" at ")
    path, _, line = where.rpartition(":")
    owner = _classify(path) if path else None
    counts: dict[str, int] = {}
    own = 0
    for inner in _equations(kernel_jaxpr):
        origin = _equation_origin(inner)
        if origin == "candidate":
            own += 1
        elif origin is not None:
            counts[origin] = counts.get(origin, 0) + 1
    interpret = eqn.params.get("interpret")
    origin = KernelOrigin(
        name=name or str(eqn.params.get("name") or "kernel"),
        defined_in=owner or "candidate",  # no file recorded: the equations decide
        line=int(line) if line.isdigit() else None,
        own_equations=own, library_equations=counts,
        interpret=repr(interpret) if interpret else None)
    _weigh_live_work(origin, kernel_jaxpr, _output_refs(eqn))
    return origin


def _output_refs(eqn: Any) -> list[Any]:
    """The body's output refs: its inputs are prefetched scalars, inputs, outputs, scratch."""
    gm = eqn.params["grid_mapping"]
    start = int(gm.num_index_operands) + int(gm.num_inputs)
    return list(eqn.params["jaxpr"].invars[start:start + int(gm.num_outputs)])


def _weigh_live_work(origin: KernelOrigin, kernel_jaxpr: Any, outputs: list[Any]) -> None:
    """Whose code emitted the work that reaches the outputs (dead code weighs nothing)."""
    for item in live_work(kernel_jaxpr, outputs):
        owner = _equation_origin(item.eqn)
        if owner == "candidate":
            origin.own_work += item.work
            origin.own_bytes += item.bytes
        elif owner is not None:
            origin.library_work[owner] = origin.library_work.get(owner, 0.0) + item.work
            origin.library_bytes[owner] = origin.library_bytes.get(owner, 0.0) + item.bytes


def _equations(jaxpr: Any) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn):
            yield from _equations(sub)


def _equation_origin(eqn: Any) -> str | None:
    """The innermost frame that is not jax's (or Python's) machinery: whose code emitted it."""
    traceback = getattr(eqn.source_info, "traceback", None)
    for frame in getattr(traceback, "frames", None) or ():
        origin = _classify(frame.file_name)
        if origin is not None:
            return origin
    return None


@functools.lru_cache(maxsize=4096)  # realpath of every frame of every equation is slow
def _classify(path: str) -> str | None:
    """'candidate', a library file (package-relative), or None for framework code."""
    if path == CANDIDATE_FILENAME:
        return "candidate"
    if not os.path.isabs(path):
        return None  # "<string>" and friends: generated by the framework
    real = os.path.realpath(path)
    if _JAX_KERNEL_LIBRARY in real:
        return _package_relative(real)
    if real.startswith(_FRAMEWORK_ROOTS):
        return None
    if real.startswith(_PACKAGE_ROOTS):  # another installed package: someone else's kernel
        return _package_relative(real)
    if real.startswith(_STDLIB_ROOT):
        return None
    return _package_relative(real)  # any other file is not the candidate's either


def _package_relative(path: str) -> str:
    for root in _PACKAGE_ROOTS:
        if path.startswith(root):
            return os.path.relpath(path, root)
    return os.path.basename(path)


def _module_root(name: str) -> str:
    module = __import__(name)
    return os.path.realpath(os.path.dirname(module.__file__)) + os.sep


def _framework_roots() -> tuple[str, ...]:
    """jax and the libraries it is built on, and our own evaluator (checked before packages:
    site-packages may lie inside the standard library's folder)."""
    return tuple(_module_root(name) for name in ("jax", "jaxlib", "numpy", "ml_dtypes", "evaluator"))


def _package_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib")}))


_FRAMEWORK_ROOTS = _framework_roots()
_PACKAGE_ROOTS = _package_roots()
_STDLIB_ROOT = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
