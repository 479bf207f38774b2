"""Where the trip count of a loop the cost model cannot bound comes from.

A kernel loop whose maximum trip count evaluator/analysis/intervals.py cannot derive counts once, so
the kernel's FLOPs are a lower bound, and the work rules (stages._missing_work and
stages.estimate_stage) stand aside: the count is undecided. That is right for a loop over a
task's integer inputs (a sequence length, group sizes: `Task.int_bounds`), which the task
says may vary. It is not right for anything else: a decoy loop whose trip count is computed
from float data (`(abs(x[0, 0]) * 1e-20).astype(int) + 1`, always 1) switched the rules off
for every kernel of the case. So this module says what each such count depends on.

It is a small taint analysis: every value carries the set of kernel() inputs it depends on,
as bits (FLOAT: float inputs; INT_INPUT: integer inputs the task bounds; OTHER: any other
input). Taint flows through every equation (an output depends on all its inputs), through
loop carries to a fixpoint, into the values a branch or loop body writes from its predicate
(an implicit flow), into refs by stores and DMAs (per ref, through aliases in sub-jaxprs,
to a fixpoint over the body), and from the glue outside kernels into each pallas_call's
operands. Literals, constants, program ids and the grid carry nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, param_jaxprs

FLOAT = 1      # float (or complex) inputs of kernel()
INT_INPUT = 2  # integer inputs whose bounds the task declares (Task.int_bounds)
OTHER = 4      # any other input (integers without declared bounds, booleans)
MAX_PASSES = 8  # over a kernel body, while what its refs hold keeps changing


def describe(origin: int) -> str:
    """'' for a count the work rules may leave undecided (only the task's bounded integer
    inputs), else what it depends on, for feedback."""
    if origin & FLOAT:
        return "float data"
    if origin & OTHER:
        return "integer data the task does not bound"
    if not origin & INT_INPUT:
        return "values the evaluator cannot bound"
    return ""


def program_origins(closed_jaxpr: Any, arg_bounds: Sequence[Sequence[float] | None] | None = None
                    ) -> dict[int, list[int]]:
    """id(pallas_call eqn) -> origin of each of its operands, through the glue outside kernels.
    `arg_bounds`: as for intervals.analyze_program (None per argument without bounds)."""
    jaxpr = closed_jaxpr.jaxpr
    bounds = list(arg_bounds) if arg_bounds is not None else [None] * len(jaxpr.invars)
    inputs = [_input_origin(v.aval, b) for v, b in zip(jaxpr.invars, bounds)]
    taint = _Taint()
    taint.run(jaxpr, inputs, 0)
    return taint.pallas_operands


def unbounded_trips_origin(pallas_eqn: Any, operands: Sequence[int] | None,
                           trips: Mapping[int, int | None], grid: Sequence[int]) -> int:
    """Origin of every trip count of the kernel left unknown: its while loops whose `trips`
    (intervals.kernel_loop_trips) is None, and its grid dimensions still dynamic (-1 in
    `grid`). 0 when there are none."""
    gm = pallas_eqn.params["grid_mapping"]
    kernel = pallas_eqn.params["jaxpr"]
    operands = list(operands or [])
    n_dynamic = int(getattr(gm, "num_dynamic_grid_bounds", 0) or 0)
    origin, dynamic = 0, 0
    for pos, g in enumerate(gm.grid):  # dynamic dimensions take the leading operands, in order
        if isinstance(g, (int, np.integer)):
            continue
        if pos < len(grid) and grid[pos] < 0:
            origin |= operands[dynamic] if dynamic < len(operands) else OTHER
        dynamic += 1
    unknown = [k for k, n in trips.items() if n is None]
    if not unknown:
        return origin
    # Body refs: prefetched scalars and inputs hold their operands; outputs hold nothing
    # (or, aliased to inputs, what the inputs hold); scratch holds nothing.
    n_ins, n_outs = int(gm.num_index_operands) + int(gm.num_inputs), int(gm.num_outputs)
    given = operands[n_dynamic:n_dynamic + n_ins]
    given += [OTHER] * (n_ins - len(given))
    aliased = _or(given) if pallas_eqn.params.get("input_output_aliases") else 0
    held = [given[i] if i < n_ins else aliased if i < n_ins + n_outs else 0
            for i in range(len(kernel.invars))]
    taint = _Taint()
    refs = []
    for i, v in enumerate(kernel.invars):
        key = id(v)
        taint.held[key] = held[i]
        refs.append(_Ref(key))
    for _ in range(MAX_PASSES):
        before = dict(taint.held)
        taint.loops.clear()
        taint.run(kernel, refs, 0)
        if taint.held == before:
            break
    for k in unknown:
        origin |= taint.loops.get(k, OTHER)
    return origin


@dataclass(frozen=True)
class _Ref:
    key: int  # the ref as the kernel body names it at its outermost binding


def _input_origin(aval: Any, bounds: Sequence[float] | None) -> int:
    try:
        kind = np.dtype(aval.dtype).kind
    except TypeError:
        return OTHER
    if kind in "iu":
        return INT_INPUT if bounds is not None else OTHER
    if kind == "b":
        return OTHER
    return FLOAT  # f, c, and bfloat16 & co. (kind 'V')


def _or(values: Sequence[Any]) -> int:
    out = 0
    for v in values:
        out |= v if isinstance(v, int) else 0
    return out


_READS = frozenset({"get", "masked_load"})
_WRITES = frozenset({"swap", "masked_swap", "addupdate"})


class _Taint:
    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # ref key -> origin of what it holds
        self.loops: dict[int, int] = {}  # id(while eqn) -> origin of its condition
        self.pallas_operands: dict[int, list[int]] = {}

    def _write(self, ref: _Ref, origin: int) -> None:
        self.held[ref.key] = self.held.get(ref.key, 0) | origin

    def run(self, jaxpr: Any, inputs: Sequence[Any], pc: int, consts: Any = None) -> list[Any]:
        env: dict[Any, Any] = {}
        for v in jaxpr.constvars:
            env[v] = _Ref(id(v)) if hasattr(v.aval, "inner_aval") else 0
        for v, x in zip(jaxpr.invars, inputs):
            env[v] = x
        read = lambda v: 0 if hasattr(v, "val") else env.get(v, 0)  # noqa: E731  (Literal: 0)
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            try:
                outs = self.eqn(eqn, ins, pc)
            except (ArithmeticError, TypeError, ValueError, KeyError, IndexError, AttributeError):
                # An odd parameter must not fail a grading: the result depends on anything.
                outs = [OTHER | _or([self._value(x) for x in ins])] * len(eqn.outvars)
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def _value(self, x: Any) -> int:
        """A value's origin; a ref's is what it holds."""
        return self.held.get(x.key, 0) if isinstance(x, _Ref) else x

    def eqn(self, eqn: Any, ins: list[Any], pc: int) -> list[Any]:
        name, n_out = eqn.primitive.name, len(eqn.outvars)
        refs = [x for x in ins if isinstance(x, _Ref)]
        values = _or([x for x in ins if not isinstance(x, _Ref)])
        if name in _READS and refs:
            return [self._value(refs[0]) | values] * n_out
        if name in _WRITES and refs:
            old = self._value(refs[0])
            self._write(refs[0], values | pc)
            return [old | values] * n_out
        if name == "dma_start":
            moved = _or([self._value(r) for r in refs]) | values | pc
            for r in refs:
                self._write(r, moved)
            return [0] * n_out
        if name == "pallas_call":
            old = self.pallas_operands.get(id(eqn))
            mine = [self._value(x) for x in ins]
            self.pallas_operands[id(eqn)] = mine if old is None else [a | b for a, b in zip(old, mine)]
            return [_or(mine)] * n_out
        if name == "cond":
            index = self._value(ins[0])
            outs = [0] * n_out
            for jaxpr, consts in _subs(eqn):
                got = self.run(jaxpr, ins[1:], pc | index, consts)
                outs = [a | self._value(b) for a, b in zip(outs, got)]
            return [o | index for o in outs]
        if name == "while":
            return self._while(eqn, ins, pc)
        if name == "scan":
            return self._scan(eqn, ins, pc)
        subs = list(_subs(eqn))
        if subs:
            if len(subs) == 1 and len(subs[0][0].invars) == len(ins) and len(subs[0][0].outvars) == n_out:
                return self.run(subs[0][0], ins, pc, subs[0][1])  # a call: jit, custom_jvp, remat
            if name == "run_scoped":
                jaxpr, consts = subs[0]
                fresh = [_Ref(id(v)) for v in jaxpr.invars]  # allocations: hold nothing yet
                got = self.run(jaxpr, fresh, pc, consts)
                return [self._value(g) for g in got][:n_out] + [0] * max(0, n_out - len(got))
            every = _or([self._value(x) for x in ins]) | pc
            for jaxpr, consts in subs:
                self.run(jaxpr, [x if isinstance(x, _Ref) else every for x in ins][:len(jaxpr.invars)]
                         + [every] * max(0, len(jaxpr.invars) - len(ins)), pc, consts)
            return [every] * n_out
        return [_or([self._value(x) for x in ins])] * n_out

    def _while(self, eqn: Any, ins: list[Any], pc: int) -> list[Any]:
        p = eqn.params
        n_cc, n_bc = p["cond_nconsts"], p["body_nconsts"]
        (cond, cond_consts), (body, body_consts) = (_open(p["cond_jaxpr"]), _open(p["body_jaxpr"]))
        cc, bc, carries = ins[:n_cc], ins[n_cc:n_cc + n_bc], list(ins[n_cc + n_bc:])
        test = 0
        for _ in range(len(carries) + 2):
            test = self._value(self.run(cond, [*cc, *carries], pc, cond_consts)[0])
            outs = self.run(body, [*bc, *carries], pc | test, body_consts)
            new = [c if isinstance(c, _Ref) else c | self._value(o) for c, o in zip(carries, outs)]
            if new == carries:
                break
            carries = new
        test = self._value(self.run(cond, [*cc, *carries], pc, cond_consts)[0])
        self.loops[id(eqn)] = self.loops.get(id(eqn), 0) | test
        return [c if isinstance(c, _Ref) else c | test for c in carries]

    def _scan(self, eqn: Any, ins: list[Any], pc: int) -> list[Any]:
        p = eqn.params
        body, consts = _open(p["jaxpr"])
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        cs, carries, xs = ins[:n_consts], list(ins[n_consts:n_consts + n_carry]), ins[n_consts + n_carry:]
        outs: list[Any] = []
        for _ in range(len(carries) + 2):
            outs = self.run(body, [*cs, *carries, *xs], pc, consts)
            new = [c if isinstance(c, _Ref) else c | self._value(o) for c, o in zip(carries, outs)]
            if new == carries:
                break
            carries = new
        return [*carries, *[self._value(o) for o in outs[n_carry:]]]


def _open(j: Any) -> tuple[Any, Any]:
    return (j.jaxpr, j.consts) if is_closed_jaxpr(j) else (j, None)


def _subs(eqn: Any) -> list[tuple[Any, Any]]:
    return [_open(j) for j in param_jaxprs(eqn.params)]
