"""What a program keeps in HBM between its kernels, and what heavy math it leaves to XLA.

The FLOP share of the glue outside kernels (evaluator/stages.py) misses one cheat: attention
written as two kernels, q @ k^T and p @ v, with the softmax in XLA over the [B, H, S, S]
logits. That softmax is ~1% of the reference's FLOPs, yet the logits make a round trip
through HBM several times the size of the task's inputs and outputs, which is exactly the
traffic a fused kernel exists to avoid. So the worker also reports, from the traced jaxpr:

- intermediates: data a pallas_call writes that reaches another pallas_call's operands,
  directly or through ops outside kernels (kernel -> HBM -> [XLA] -> kernel), with the
  largest tensor on that path and the outside ops applied along it;
- outside math: transcendental and reduction ops outside kernels, with the size of the
  tensor they run over.

Sizes are bytes times the number of times the equation runs (the trip counts of the loops
around it), so the cheat done one head at a time in a loop weighs what it weighs in one go.
The host (stages.structure_stage) judges them against the case's inputs plus outputs; this
module only measures. The analysis is a forward taint: each value carries, per kernel whose
output it derives from, the largest tensor on the way and the ops met. Calls (jit,
custom_vjp, remat) bind operands by position, loops iterate to a fixed point, a cond joins
its branches; the kernels' bodies are not entered.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from evaluator.analysis.jaxpr_cost import (DATA_MOVEMENT_PRIMITIVES, REDUCTION_PRIMITIVES, TRANSCENDENTAL_PRIMITIVES,
                                           aval_nbytes, trip_count)
from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, sub_jaxprs
from tasks.spec import np_dtype

MAX_REPORTED = 6  # the largest few of each kind reach the host; the rest is noise for feedback
MAX_PATH_OPS = 8


@dataclass
class Intermediate:
    """Data that goes kernel -> HBM -> kernel: the largest tensor on the way (`nbytes` counts
    every run of the equation that makes it) and the primitives applied to it outside."""

    producer: str  # kernel names, for feedback
    consumer: str
    shape: list[int]
    dtype: str
    nbytes: float
    outside_ops: list[str] = field(default_factory=list)


@dataclass
class OutsideMath:
    """A transcendental or reduction outside kernels, over a tensor of `nbytes` (all runs)."""

    op: str
    shape: list[int]
    dtype: str
    nbytes: float


@dataclass(frozen=True)
class _Path:
    """What one value carries for one producing kernel."""

    nbytes: float
    shape: tuple[int, ...]
    dtype: str
    ops: tuple[str, ...] = ()

    def merge(self, other: "_Path") -> "_Path":
        big = self if self.nbytes >= other.nbytes else other
        ops = self.ops + tuple(o for o in other.ops if o not in self.ops)
        return _Path(big.nbytes, big.shape, big.dtype, ops[:MAX_PATH_OPS])

    def through(self, nbytes: float, shape: tuple[int, ...], dtype: str, op: str | None) -> "_Path":
        """This path continued into a value of `nbytes` made by `op` (None: a plain binding)."""
        path = self if self.nbytes >= nbytes else _Path(nbytes, shape, dtype, self.ops)
        if op and op not in path.ops and len(path.ops) < MAX_PATH_OPS:
            path = _Path(path.nbytes, path.shape, path.dtype, path.ops + (op,))
        return path


Taint = dict[str, _Path]  # producing kernel label -> path


@dataclass
class Dataflow:
    intermediates: list[Intermediate]
    outside_math: list[OutsideMath]


def analyze(jaxpr: Any, trips: Mapping[int, int | None] | None,
            kernel_name: Callable[[Any], str]) -> Dataflow:
    """Intermediates between kernels and outside math of an open jaxpr (the program's)."""
    walker = _Walker(trips or {}, kernel_name)
    walker.run(jaxpr, [{} for _ in jaxpr.invars], 1.0)
    inter = sorted(walker.intermediates.values(), key=lambda i: -i.nbytes)
    math_ops = sorted(walker.math.values(), key=lambda m: -m.nbytes)
    return Dataflow(inter[:MAX_REPORTED], _distinct(math_ops)[:MAX_REPORTED])


def _distinct(ops: list[OutsideMath]) -> list[OutsideMath]:
    seen, out = set(), []
    for m in ops:
        key = (m.op, tuple(m.shape), m.dtype)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _is_var(v: Any) -> bool:
    return hasattr(v, "aval") and not hasattr(v, "val")  # Literals carry .val


def _join(a: Taint, b: Taint) -> Taint:
    if not b:
        return a
    out = dict(a)
    for label, path in b.items():
        out[label] = out[label].merge(path) if label in out else path
    return out


class _Walker:
    def __init__(self, trips: Mapping[int, int | None], kernel_name: Callable[[Any], str]) -> None:
        self.trips = trips
        self.kernel_name = kernel_name
        self.labels: dict[int, str] = {}  # id(pallas eqn) -> "name" (numbered when repeated)
        self.intermediates: dict[tuple[str, str], Intermediate] = {}
        self.math: dict[int, OutsideMath] = {}  # id(eqn) -> the largest visit

    def run(self, jaxpr: Any, in_taints: list[Taint], mult: float) -> list[Taint]:
        env: dict[Any, Taint] = {}
        for v, t in zip(jaxpr.invars, in_taints):
            if _is_var(v) and t:
                env[v] = _join(env.get(v, {}), t)

        def read(v: Any) -> Taint:
            return env.get(v, {}) if _is_var(v) else {}

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            outs = self._eqn(eqn, ins, mult)
            for v, t in zip(eqn.outvars, outs):
                if _is_var(v) and t:
                    env[v] = t
        return [read(v) for v in jaxpr.outvars]

    def _label(self, eqn: Any) -> str:
        if id(eqn) not in self.labels:
            name = self.kernel_name(eqn)
            taken = sum(1 for n in self.labels.values() if n == name or n.startswith(f"{name} #"))
            self.labels[id(eqn)] = name if not taken else f"{name} #{taken + 1}"
        return self.labels[id(eqn)]

    def _eqn(self, eqn: Any, ins: list[Taint], mult: float) -> list[Taint]:
        name = eqn.primitive.name
        if name == "pallas_call":
            return self._pallas(eqn, ins, mult)
        subs = list(sub_jaxprs(eqn))
        if subs:
            return self._nested(eqn, subs, ins, mult)
        self._note_math(eqn, mult)
        joined: Taint = {}
        for t in ins:
            joined = _join(joined, t)
        if not joined:
            return [{} for _ in eqn.outvars]
        op = None if name in DATA_MOVEMENT_PRIMITIVES else name
        outs = []
        for v in eqn.outvars:
            shape, dtype, nbytes = _describe(v, mult)
            outs.append({label: p.through(nbytes, shape, dtype, op) for label, p in joined.items()})
        return outs

    def _pallas(self, eqn: Any, ins: list[Taint], mult: float) -> list[Taint]:
        label = self._label(eqn)
        for t in ins:
            for producer, path in t.items():
                key = (producer, label)
                old = self.intermediates.get(key)
                if old is None or path.nbytes > old.nbytes:
                    self.intermediates[key] = Intermediate(producer, label, list(path.shape), path.dtype,
                                                           path.nbytes, list(path.ops))
        outs = []
        for v in eqn.outvars:
            shape, dtype, nbytes = _describe(v, mult)
            outs.append({label: _Path(nbytes, shape, dtype)})
        return outs

    def _note_math(self, eqn: Any, mult: float) -> None:
        name = eqn.primitive.name
        if name not in TRANSCENDENTAL_PRIMITIVES and name not in REDUCTION_PRIMITIVES:
            return
        biggest = max((v for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")),
                      key=lambda v: aval_nbytes(v.aval), default=None)
        if biggest is None:
            return
        shape, dtype, nbytes = _describe(biggest, mult)
        old = self.math.get(id(eqn))
        if old is None or nbytes > old.nbytes:
            self.math[id(eqn)] = OutsideMath(name, list(shape), dtype, nbytes)

    def _nested(self, eqn: Any, subs: list[Any], ins: list[Taint], mult: float) -> list[Taint]:
        """Loops, conds and calls: operands bound by position, results mapped back."""
        name, params = eqn.primitive.name, eqn.params
        count, _ = trip_count(eqn, self.trips)
        inner = mult * count
        n_out = len(eqn.outvars)
        if name == "cond":
            outs = [{} for _ in range(n_out)]
            for branch in subs:
                res = self.run(branch, ins[1:], inner)
                outs = [_join(o, r) for o, r in zip(outs, res)]
            return self._resized(eqn, outs, mult)
        if name == "scan":
            (body,) = subs
            nconsts, ncarry = params["num_consts"], params["num_carry"]
            carry = ins[nconsts:nconsts + ncarry]
            res: list[Taint] = []
            for _ in range(8):  # taints only grow; a few rounds reach the fixed point
                res = self.run(body, ins[:nconsts] + carry + ins[nconsts + ncarry:], inner)
                grown = [_join(c, r) for c, r in zip(carry, res[:ncarry])]
                if grown == carry:
                    break
                carry = grown
            return self._resized(eqn, carry + res[ncarry:], mult)
        if name == "while":
            body = params["body_jaxpr"]
            body = body.jaxpr if is_closed_jaxpr(body) else body
            nc, nb = params["cond_nconsts"], params["body_nconsts"]
            consts, carry = ins[nc:nc + nb], ins[nc + nb:]
            for _ in range(8):
                res = self.run(body, consts + carry, inner)
                grown = [_join(c, r) for c, r in zip(carry, res)]
                if grown == carry:
                    break
                carry = grown
            return self._resized(eqn, carry, mult)
        outs = [{} for _ in range(n_out)]
        for sub in subs:  # calls (jit, custom_vjp/jvp, remat): operands bind from the end
            if len(sub.invars) <= len(ins):
                res = self.run(sub, ins[len(ins) - len(sub.invars):], inner)
            else:  # an unexpected layout: every operand may reach every result
                everything: Taint = {}
                for t in ins:
                    everything = _join(everything, t)
                res = self.run(sub, [everything] * len(sub.invars), inner)
            for i, r in enumerate(res[len(res) - n_out:] if len(res) >= n_out else res):
                outs[i] = _join(outs[i], r)
        return self._resized(eqn, outs, mult)

    def _resized(self, eqn: Any, outs: list[Taint], mult: float) -> list[Taint]:
        """A nested equation's results as they live outside it (a scan's stacked ys)."""
        resized = []
        for v, t in zip(eqn.outvars, outs):
            shape, dtype, nbytes = _describe(v, mult)
            resized.append({label: p.through(nbytes, shape, dtype, None) for label, p in t.items()})
        return resized


def _describe(v: Any, mult: float) -> tuple[tuple[int, ...], str, float]:
    aval = v.aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return shape, str(getattr(aval, "dtype", "")), mult * aval_nbytes(aval)


# --- the host's judgement ---------------------------------------------------------------------
# Rationale: an ideal kernel reads every input once and writes every output once. A tensor
# between kernels more than twice that size costs, in its round trip alone (written once, read
# once), over four times the ideal's traffic. The attention cheat's [B, H, S, S] logits pass it
# once S > 8 x head_dim (4-12x over it at the attention tasks' bench sizes); an unfused MLP's
# hidden activation [M, F] never does when F <= 4 D, at any M (M F < 2 (2 M D + 2 D F)); nor
# do the suite's honest multi-kernel programs (at most 0.5x: transformer_mlp_bwd's solution),
# nor split-K partial sums [splits, M, N] unless the splits outnumber ~4 K / N, where each
# split's partial costs more to write than its slice of K costs to read.
INTERMEDIATE_LIMIT = 2.0


@dataclass
class Weighed:
    """The largest intermediate or outside math of a case against its inputs + outputs."""

    ratio: float  # of the largest, normalised (see `weigh`); 0 when there is none
    message: str | None = None  # why it is refused, when it is
    details: dict[str, Any] = field(default_factory=dict)


def weigh(intermediates: list[Intermediate], outside_math: list[OutsideMath],
          arrays: list[tuple[tuple[int, ...], str]], case_label: str) -> Weighed:
    """Judge a case's intermediates and outside math against its arrays (inputs and outputs,
    as (shape, dtype)). A tensor counts at no more than the widest element among those
    arrays: a float32 copy of a bfloat16 problem's activation is a choice of precision, not
    a bigger intermediate."""
    io_bytes = sum(_elements(shape) * np_dtype(dtype).itemsize for shape, dtype in arrays)
    widest = max((np_dtype(dtype).itemsize for _, dtype in arrays), default=4)
    if not io_bytes:
        return Weighed(0.0)

    def ratio(nbytes: float, dtype: str) -> float:
        try:
            own = np_dtype(dtype).itemsize
        except (TypeError, AttributeError):
            own = widest
        return nbytes * min(1.0, widest / max(own, 1)) / io_bytes

    top_inter = max(intermediates, key=lambda i: ratio(i.nbytes, i.dtype), default=None)
    top_math = max(outside_math, key=lambda m: ratio(m.nbytes, m.dtype), default=None)
    r_inter = ratio(top_inter.nbytes, top_inter.dtype) if top_inter else 0.0
    r_math = ratio(top_math.nbytes, top_math.dtype) if top_math else 0.0
    weighed = Weighed(max(r_inter, r_math))
    io_text = f"{_size(io_bytes)}; the limit is {INTERMEDIATE_LIMIT:g}x"
    if top_inter is not None and r_inter > INTERMEDIATE_LIMIT:
        i = top_inter
        tensor = f"a {list(i.shape)} {i.dtype} tensor{_runs(i.nbytes, i.shape, i.dtype)}"
        via = (f", with {', '.join(i.outside_ops)} computed on it outside any Pallas kernel"
               if i.outside_ops else "")
        route = (f"kernel {i.producer} passes {tensor} to its own next run through HBM"
                 if i.producer == i.consumer else
                 f"kernel {i.producer} passes {tensor} to kernel {i.consumer} through HBM")
        weighed.message = (
            f"at case {case_label} {route}{via}: {_size(i.nbytes)}, {r_inter:.1f}x the case's "
            f"inputs and outputs together ({io_text}); fuse these steps into one kernel that "
            "computes and uses this tensor block by block in VMEM, never writing it to HBM.")
        weighed.details = {"intermediate": dataclasses.asdict(i), "ratio": r_inter,
                           "io_bytes": io_bytes}
    elif top_math is not None and r_math > INTERMEDIATE_LIMIT:
        m = top_math
        ops = [o.op for o in outside_math
               if (o.shape, o.dtype) == (m.shape, m.dtype) and ratio(o.nbytes, o.dtype) > INTERMEDIATE_LIMIT]
        names = ", ".join(dict.fromkeys(ops))
        weighed.message = (
            f"at case {case_label} {names} {'runs' if len(set(ops)) == 1 else 'run'} outside any "
            f"Pallas kernel over a {list(m.shape)} {m.dtype} tensor{_runs(m.nbytes, m.shape, m.dtype)}"
            f" ({_size(m.nbytes)}, {r_math:.1f}x the case's inputs and outputs together, "
            f"{io_text}); exponentials, logs and reductions over a tensor that large are part of "
            "the task: compute them inside the kernel that produces or uses the tensor.")
        weighed.details = {"outside_math": dataclasses.asdict(m), "ops": list(dict.fromkeys(ops)),
                           "ratio": r_math, "io_bytes": io_bytes}
    return weighed


def _elements(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _runs(nbytes: float, shape: list[int], dtype: str) -> str:
    """", made 64 times in a loop" when the bytes count several runs of the equation."""
    try:
        once = _elements(shape) * np_dtype(dtype).itemsize
    except (TypeError, AttributeError):
        return ""
    runs = nbytes / once if once else 1.0
    return f", made {runs:.0f} times in a loop" if runs > 1.5 else ""


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} bytes"
