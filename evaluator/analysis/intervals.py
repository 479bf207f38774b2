"""Bounds on the integer values of a traced program: how many times can a loop run?

A `lax.fori_loop(0, n, ...)` whose `n` is read from data (a sequence length prefetched into
SMEM) traces to a `while` whose trip count the jaxpr does not state. Counted once, a kernel
that does all its work in such a loop looks almost idle (the paged-attention solution read
as 0.07x its reference's FLOPs), and a cheat that writes zeros at bench sizes looks no
different from it. So the cost model counts such loops at their *maximum* trip count, and
this module finds it.

It is a small abstract interpreter: every value gets an `Interval` [lo, hi] holding all of
its elements. Intervals start from the task's bounds on integer inputs (`Task.arg_bounds`),
literals and constants, and the grid (`program_id`); they flow through the glue outside
kernels into each `pallas_call`'s scalar-prefetch operands, and from those SMEM refs into the
kernel body. A `while` whose condition compares an induction variable (a carry that changes
by a constant step) with a bounded value gets a maximum trip count; any other `while` gets
None (unknown), which the cost model counts once and flags.

What it cannot bound (unbounded, so a loop on it is unknown): values computed from float
data, anything a primitive without a rule here produces, loop carries other than induction
variables and loop invariants, SMEM scratch and prefetch refs the kernel writes to, and
conditions other than one comparison of the counter (`i * 2 < n`, `(i < n) & ok`). It is not
relational: `x - x` is 0, but `(x + 1) - x` is only known to lie in [1 - span, 1 + span].
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, param_jaxprs

INF = math.inf


@dataclass(frozen=True)
class Interval:
    """Every element of a value lies in [lo, hi]; -inf / inf where unbounded."""

    lo: float = -INF
    hi: float = INF

    @staticmethod
    def exact(value: float) -> "Interval":
        return Interval(value, value)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def is_exact(self) -> bool:
        return self.lo == self.hi

    def join(self, other: "Interval") -> "Interval":
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))


UNBOUNDED = Interval()
BOOL = Interval(0, 1)
# Passes over a loop body before a carry that keeps growing is declared unbounded.
WIDEN_AFTER = 3


@dataclass
class ProgramBounds:
    """What the interval pass learnt about one traced program (keys are id() of eqns)."""

    loop_trips: dict[int, int | None] = field(default_factory=dict)  # while -> max trips
    pallas_operands: dict[int, list[Interval]] = field(default_factory=dict)
    outputs: list[Interval] = field(default_factory=list)  # of the program's results


def as_intervals(bounds: Sequence[Sequence[float] | None] | None, n: int) -> list[Interval]:
    """Per-argument (lo, hi) pairs or None (JSON gives lists) as n Intervals."""
    if bounds is None:
        return [UNBOUNDED] * n
    if len(bounds) != n:
        raise ValueError(f"{len(bounds)} argument bounds for {n} arguments")
    return [UNBOUNDED if b is None else Interval(b[0], b[1]) for b in bounds]


def analyze_program(closed_jaxpr: Any, arg_bounds: Sequence[Sequence[float] | None] | None = None
                    ) -> ProgramBounds:
    """Bounds through a whole traced program (the glue outside kernels): trip counts of its
    own while loops and the operand intervals of every pallas_call, kernel bodies untouched."""
    jaxpr = closed_jaxpr.jaxpr
    interp = _Interpreter()
    outs = interp.run(jaxpr, as_intervals(arg_bounds, len(jaxpr.invars)), closed_jaxpr.consts)
    return ProgramBounds(interp.trips, interp.pallas_operands, outs)


def kernel_loop_trips(pallas_eqn: Any, operands: Sequence[Interval] | None = None
                      ) -> dict[int, int | None]:
    """Maximum trip count of every while loop in a pallas_call's kernel body (id(eqn) ->
    trips, None where unknown), given the intervals of the call's operands."""
    gm = pallas_eqn.params["grid_mapping"]
    kernel = pallas_eqn.params["jaxpr"]
    n_dynamic = int(getattr(gm, "num_dynamic_grid_bounds", 0) or 0)
    n_prefetch = int(gm.num_index_operands)
    given = list(operands or [])[n_dynamic:n_dynamic + n_prefetch]
    prefetch = given + [UNBOUNDED] * (n_prefetch - len(given))
    # A prefetch ref the kernel writes to no longer holds the operand's values.
    inputs = [iv if _only_read(kernel, kernel.invars[i]) else UNBOUNDED
              for i, iv in enumerate(prefetch)]
    inputs += [UNBOUNDED] * (len(kernel.invars) - n_prefetch)
    grid = [int(g) if isinstance(g, (int, np.integer)) else None for g in gm.grid]
    interp = _Interpreter(grid)
    interp.run(kernel, inputs, None)
    return interp.trips


# --- the interpreter ---------------------------------------------------------------------
class _Interpreter:
    def __init__(self, grid: Sequence[int | None] = ()) -> None:
        self.grid = list(grid)
        self.trips: dict[int, int | None] = {}
        self.pallas_operands: dict[int, list[Interval]] = {}
        self.recording = True  # off while a loop body is iterated towards its fixpoint

    def run(self, jaxpr: Any, inputs: Sequence[Interval], consts: Sequence[Any] | None
            ) -> list[Interval]:
        env = self.run_env(jaxpr, inputs, consts)
        return [_read(env, v) for v in jaxpr.outvars]

    def run_env(self, jaxpr: Any, inputs: Sequence[Interval], consts: Sequence[Any] | None
                ) -> dict[Any, Interval]:
        env: dict[Any, Interval] = {}
        for v, c in zip(jaxpr.constvars, consts if consts is not None else ()):
            env[v] = _of_value(c)
        for v, iv in zip(jaxpr.invars, inputs):
            env[v] = iv
        for eqn in jaxpr.eqns:
            ins = [_read(env, v) for v in eqn.invars]
            try:
                outs = self.eqn(eqn, ins)
            except (ArithmeticError, TypeError, ValueError, KeyError, IndexError, AttributeError):
                # An odd parameter must not fail a grading: the value is just unknown.
                outs = [UNBOUNDED] * len(eqn.outvars)
            for v, iv in zip(eqn.outvars, outs):
                env[v] = _fit(iv, getattr(v, "aval", None))
        return env

    def eqn(self, eqn: Any, ins: list[Interval]) -> list[Interval]:
        name = eqn.primitive.name
        n_out = len(eqn.outvars)
        if name == "while":
            return self.while_loop(eqn, ins)
        if name == "scan":
            return self.scan(eqn, ins)
        if name == "cond":
            return self.cond(eqn, ins)
        if name == "pallas_call":
            if self.recording:
                old = self.pallas_operands.get(id(eqn))
                self.pallas_operands[id(eqn)] = ins if old is None else [
                    a.join(b) for a, b in zip(old, ins)]
            return [UNBOUNDED] * n_out
        if name == "program_id":
            size = self._grid_dim(eqn.params["axis"])
            return [Interval(0, size - 1 if size else INF)]
        if name == "num_programs":
            size = self._grid_dim(eqn.params["axis"])
            return [Interval.exact(size) if size else Interval(1, INF)]
        rule = RULES.get(name)
        if rule is not None:
            out = rule(eqn, ins)
            return out if isinstance(out, list) else [out]
        subs = [_open(j) for j in param_jaxprs(eqn.params)]
        if len(subs) == 1 and len(subs[0][0].invars) == len(ins) and len(subs[0][0].outvars) == n_out:
            return self.run(subs[0][0], ins, subs[0][1])  # a call: jit, remat, custom_jvp...
        for jaxpr, consts in subs:  # unknown semantics: still visit the loops inside
            self.run(jaxpr, [UNBOUNDED] * len(jaxpr.invars), consts)
        return [UNBOUNDED] * n_out

    def _grid_dim(self, axis: int) -> int | None:
        return self.grid[axis] if axis < len(self.grid) else None

    # -- control flow --------------------------------------------------------------------
    def cond(self, eqn: Any, ins: list[Interval]) -> list[Interval]:
        branches = [_open(b) for b in eqn.params["branches"]]
        index, operands = ins[0], ins[1:]
        lo = max(0, int(index.lo)) if math.isfinite(index.lo) else 0
        hi = min(len(branches) - 1, int(index.hi)) if math.isfinite(index.hi) else len(branches) - 1
        result: list[Interval] | None = None
        for k, (jaxpr, consts) in enumerate(branches):
            outs = self.run(jaxpr, operands, consts)  # every branch, for the loops inside
            if lo <= k <= hi:
                result = outs if result is None else [a.join(b) for a, b in zip(result, outs)]
        return result if result is not None else [UNBOUNDED] * len(eqn.outvars)

    def scan(self, eqn: Any, ins: list[Interval]) -> list[Interval]:
        p = eqn.params
        body, body_consts = _open(p["jaxpr"])
        n_consts, n_carry, length = p["num_consts"], p["num_carry"], int(p["length"])
        consts, init, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        run_body = lambda carries: self.run(body, [*consts, *carries, *xs], body_consts)  # noqa: E731
        steps = self._induction_steps(body, body_consts, n_consts, n_carry, consts, xs)
        carries = self._invariants(run_body, init, steps)
        inside = _induction_ranges(carries, init, steps, length)
        outs = run_body(inside)  # the last pass records
        return [*_after_loop(carries, init, steps, length), *outs[n_carry:]]

    def while_loop(self, eqn: Any, ins: list[Interval]) -> list[Interval]:
        p = eqn.params
        n_cc, n_bc = p["cond_nconsts"], p["body_nconsts"]
        cond, cond_consts_vals = _open(p["cond_jaxpr"])
        body, body_consts_vals = _open(p["body_jaxpr"])
        cond_consts, body_consts, init = ins[:n_cc], ins[n_cc:n_cc + n_bc], ins[n_cc + n_bc:]
        n_carry = len(init)
        run_body = lambda carries: self.run(body, [*body_consts, *carries], body_consts_vals)  # noqa: E731
        steps = self._induction_steps(body, body_consts_vals, n_bc, n_carry, body_consts, [])
        carries = self._invariants(run_body, init, steps)
        trips = _while_trips(cond, self.run_env(cond, [*cond_consts, *carries], cond_consts_vals),
                             n_cc, init, steps)
        inside = _induction_ranges(carries, init, steps, trips)
        if self.recording:
            old = self.trips.get(id(eqn), trips)
            self.trips[id(eqn)] = None if old is None or trips is None else max(old, trips)
        self.run(cond, [*cond_consts, *inside], cond_consts_vals)  # the last pass records
        run_body(inside)
        return _after_loop(carries, init, steps, trips)

    def _induction_steps(self, body: Any, body_consts_vals: Any, n_consts: int, n_carry: int,
                         consts: list[Interval], xs: list[Interval]) -> list[int | None]:
        """Per carry, its constant step if the body returns it plus or minus a value that is
        the same whatever the carries hold (fori_loop's counter: `i + 1`), else None."""
        was, self.recording = self.recording, False
        try:
            env = self.run_env(body, [*consts, *[UNBOUNDED] * n_carry, *xs], body_consts_vals)
        finally:
            self.recording = was
        producers = {id(v): e for e in body.eqns for v in e.outvars}
        steps: list[int | None] = []
        for k in range(n_carry):
            carry_in, out = body.invars[n_consts + k], body.outvars[k]
            steps.append(_step(producers.get(id(out)), carry_in, env))
        return steps

    def _invariants(self, run_body: Callable[[list[Interval]], list[Interval]],
                    init: list[Interval], steps: list[int | None]) -> list[Interval]:
        """Intervals that hold every carry other than the induction variables on every
        iteration: join the body's outputs into them until they stop growing (widening the
        ones still growing after WIDEN_AFTER passes to unbounded)."""
        carries = [UNBOUNDED if s is not None else iv for s, iv in zip(steps, init)]
        was, self.recording = self.recording, False
        try:
            for passes in range(WIDEN_AFTER + len(carries) + 1):
                outs = run_body(carries)
                new = [c if s is not None else c.join(o) for c, s, o in zip(carries, steps, outs)]
                if new == carries:
                    break
                if passes + 1 >= WIDEN_AFTER:
                    new = [n if n == c else UNBOUNDED for n, c in zip(new, carries)]
                carries = new
            else:
                carries = [c if s is not None else UNBOUNDED for c, s in zip(carries, steps)]
        finally:
            self.recording = was
        return carries


def _step(producer: Any, carry_in: Any, env: dict[Any, Interval]) -> int | None:
    if producer is None or producer.primitive.name not in ("add", "sub"):
        return None
    a, b = producer.invars
    if a is carry_in:
        other, sign = b, (1 if producer.primitive.name == "add" else -1)
    elif b is carry_in and producer.primitive.name == "add":
        other, sign = a, 1
    else:
        return None
    iv = _read(env, other)
    if not iv.is_exact or not math.isfinite(iv.lo) or iv.lo != int(iv.lo) or iv.lo == 0:
        return None
    return sign * int(iv.lo)


def _induction_ranges(carries: list[Interval], init: list[Interval], steps: list[int | None],
                      trips: int | None) -> list[Interval]:
    """The carries' intervals inside the body: an induction variable with step s over at
    most `trips` iterations takes init + j * s for j < trips."""
    out = []
    for c, iv, s in zip(carries, init, steps):
        if s is None:
            out.append(c)
        elif trips is None:
            out.append(Interval(iv.lo, INF) if s > 0 else Interval(-INF, iv.hi))
        else:
            span = max(trips - 1, 0) * s
            out.append(Interval(iv.lo + min(span, 0), iv.hi + max(span, 0)))
    return out


def _after_loop(carries: list[Interval], init: list[Interval], steps: list[int | None],
                trips: int | None) -> list[Interval]:
    return _induction_ranges(carries, init, steps, None if trips is None else trips + 1)


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "ne": "ne"}


def _while_trips(cond: Any, env: dict[Any, Interval], n_consts: int, init: list[Interval],
                 steps: list[int | None]) -> int | None:
    """Most iterations of `while counter <op> bound`, or None if the condition is not that."""
    producers = {id(v): e for e in cond.eqns for v in e.outvars}
    test = producers.get(id(cond.outvars[0]))
    if test is None or test.primitive.name not in _FLIP:
        return None
    op = test.primitive.name
    a, b = (_carry_of(v, cond, producers, n_consts) for v in test.invars)
    if a is not None and steps[a] is not None:
        k, bound = a, _read(env, test.invars[1])
    elif b is not None and steps[b] is not None:
        k, bound, op = b, _read(env, test.invars[0]), _FLIP[op]
    else:
        return None
    start, s = init[k], steps[k]
    if op in ("lt", "le") and s > 0:
        span = bound.hi - start.lo + (op == "le")
    elif op in ("gt", "ge") and s < 0:
        span = start.hi - bound.lo + (op == "ge")
    elif op == "ne" and abs(s) == 1:  # ends only when the counter meets the bound
        span = bound.hi - start.lo if s > 0 else start.hi - bound.lo
    else:
        return None
    if not math.isfinite(span):
        return None
    return max(0, math.ceil(span / abs(s)))


def _carry_of(var: Any, cond: Any, producers: dict[int, Any], n_consts: int) -> int | None:
    """Which carry a compared value is (through a cast), or None."""
    producer = producers.get(id(var))
    if producer is not None and producer.primitive.name == "convert_element_type":
        var = producer.invars[0]
    for i, v in enumerate(cond.invars):
        if v is var:
            return i - n_consts if i >= n_consts else None
    return None


# --- which refs a kernel only reads ------------------------------------------------------
_READS = frozenset({"get", "masked_load"})


def _only_read(jaxpr: Any, ref: Any) -> bool:
    """True if the kernel only reads `ref` (get/load), also inside loops and calls."""
    for eqn in jaxpr.eqns:
        positions = [i for i, v in enumerate(eqn.invars) if v is ref]
        if not positions:
            continue
        if eqn.primitive.name in _READS and positions == [0]:
            continue
        bound = _bindings(eqn)
        if not bound:
            return False
        for i in positions:
            inner = [(sub, sub.invars[j]) for sub, outer_index in bound
                     for j, o in enumerate(outer_index) if o == i]
            if not inner or not all(_only_read(sub, v) for sub, v in inner):
                return False
    return True


def _bindings(eqn: Any) -> list[tuple[Any, list[int | None]]]:
    """Each sub-jaxpr of eqn with, per invar, the index of the eqn operand bound to it
    (None: a fresh value, as run_scoped's allocations)."""
    p, name = eqn.params, eqn.primitive.name
    n = len(eqn.invars)
    if name == "while":
        n_cc, n_bc = p["cond_nconsts"], p["body_nconsts"]
        carries = list(range(n_cc + n_bc, n))
        return [(_open(p["cond_jaxpr"])[0], [*range(n_cc), *carries]),
                (_open(p["body_jaxpr"])[0], [*range(n_cc, n_cc + n_bc), *carries])]
    if name == "cond":
        return [(_open(b)[0], list(range(1, n))) for b in p["branches"]]
    subs = [_open(j)[0] for j in param_jaxprs(p)]
    return [(s, list(range(n)) if len(s.invars) == n else [None] * len(s.invars)) for s in subs]


# --- helpers -----------------------------------------------------------------------------
def _open(j: Any) -> tuple[Any, Any]:
    """(Jaxpr, consts or None) of a ClosedJaxpr or a Jaxpr."""
    if is_closed_jaxpr(j):
        return j.jaxpr, j.consts
    return j, None


def _read(env: dict[Any, Interval], v: Any) -> Interval:
    if hasattr(v, "val"):  # a Literal (Vars have no value)
        return _of_value(v.val)
    return env.get(v, UNBOUNDED)


def _of_value(value: Any) -> Interval:
    """The interval of a concrete value (literal or constant): its min and max."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001  (not an array: a token, a ref, an opaque constant)
        return UNBOUNDED
    if arr.size == 0 or arr.dtype.kind not in "biuf":
        return UNBOUNDED
    lo, hi = arr.min(), arr.max()
    if arr.dtype.kind in "biu":
        return Interval(int(lo), int(hi))
    if np.isnan(lo) or np.isnan(hi):
        return UNBOUNDED
    return Interval(float(lo), float(hi))


def _fit(iv: Interval, aval: Any) -> Interval:
    """Keep an interval within its dtype: bools in [0, 1]; an integer that may overflow
    wraps to anything, so it becomes unknown."""
    dtype = getattr(aval, "dtype", None)
    if dtype is None or hasattr(aval, "inner_aval"):  # refs carry their contents' interval
        return iv
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        return iv
    if kind == "b":
        return Interval(max(iv.lo, 0), min(iv.hi, 1)) if iv.lo <= 1 and iv.hi >= 0 else BOOL
    if kind in "iu":
        info = np.iinfo(np.dtype(dtype))
        lo = math.ceil(iv.lo) if math.isfinite(iv.lo) else iv.lo
        hi = math.floor(iv.hi) if math.isfinite(iv.hi) else iv.hi
        if info.min <= lo and hi <= info.max:
            return Interval(lo, hi)
        return UNBOUNDED
    return iv


def _is_int(eqn: Any) -> bool:
    try:
        return np.dtype(eqn.outvars[0].aval.dtype).kind in "biu"
    except TypeError:
        return False


# --- primitive rules: (eqn, input intervals) -> output interval(s) -------------------------
def _mul(a: float, b: float) -> float:
    return 0 if a == 0 or b == 0 else a * b


def _corners(f: Callable[[float, float], float], a: Interval, b: Interval) -> Interval:
    values = [f(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    if any(math.isnan(v) for v in values):
        return UNBOUNDED
    return Interval(min(values), max(values))


def _add(eqn: Any, ins: list[Interval]) -> Interval:
    a, b = ins
    return Interval(a.lo + b.lo, a.hi + b.hi)


def _sub(eqn: Any, ins: list[Interval]) -> Interval:
    a, b = ins
    if eqn.invars[0] is eqn.invars[1] and not hasattr(eqn.invars[0], "val") and _is_int(eqn):
        return Interval.exact(0)
    return Interval(a.lo - b.hi, a.hi - b.lo)


def _trunc_div(x: float, y: float) -> float:
    if math.isinf(x) or math.isinf(y):
        q = x / y
        return q if math.isinf(q) else 0  # inf / finite, or finite / inf
    q = abs(int(x)) // abs(int(y))
    return q if (x >= 0) == (y > 0) else -q


def _div(eqn: Any, ins: list[Interval]) -> Interval:
    a, b = ins
    if not _is_int(eqn):
        return _corners(lambda x, y: x / y, a, b) if b.lo > 0 or b.hi < 0 else UNBOUNDED
    if b.lo > 0 or b.hi < 0:  # integer division rounds towards zero, monotone in both
        return _corners(_trunc_div, a, b)
    m = max(abs(a.lo), abs(a.hi))  # |x / y| <= |x| for y != 0; x / 0 is -1 on XLA
    return Interval(min(-m, -1), max(m, -1))


def _rem(eqn: Any, ins: list[Interval]) -> Interval:
    """x rem y takes x's sign and |x rem y| < |y|, <= |x| (x rem 0 is x on XLA)."""
    a, b = ins
    if a.is_exact and b.is_exact and a.bounded and b.lo != 0 and _is_int(eqn):
        q = _trunc_div(a.lo, b.lo)
        return Interval.exact(a.lo - q * b.lo)
    if not _is_int(eqn) and b.lo <= 0 <= b.hi:
        return UNBOUNDED  # fmod(x, 0) is NaN
    m = max(abs(b.lo), abs(b.hi))
    if _is_int(eqn):
        m -= 1
    lo = 0 if a.lo >= 0 else max(a.lo, -m)
    hi = 0 if a.hi <= 0 else min(a.hi, m)
    out = Interval(lo, hi)
    return out.join(a) if b.lo <= 0 <= b.hi else out


def _max(eqn: Any, ins: list[Interval]) -> Interval:
    a, b = ins
    return Interval(max(a.lo, b.lo), max(a.hi, b.hi))


def _min(eqn: Any, ins: list[Interval]) -> Interval:
    a, b = ins
    return Interval(min(a.lo, b.lo), min(a.hi, b.hi))


def _clamp(eqn: Any, ins: list[Interval]) -> Interval:
    lo, x, hi = ins  # lax.clamp(min, operand, max)
    return Interval(max(lo.lo, min(x.lo, hi.lo)), max(lo.hi, min(x.hi, hi.hi)))


def _abs(eqn: Any, ins: list[Interval]) -> Interval:
    (a,) = ins
    if a.lo >= 0:
        return a
    if a.hi <= 0:
        return Interval(-a.hi, -a.lo)
    return Interval(0, max(-a.lo, a.hi))


def _sign(eqn: Any, ins: list[Interval]) -> Interval:
    (a,) = ins
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    return Interval(sign(a.lo), sign(a.hi))


def _integer_pow(eqn: Any, ins: list[Interval], y: int | None = None) -> Interval:
    (a,) = ins
    y = eqn.params["y"] if y is None else y
    if y < 0:
        return UNBOUNDED
    values = [a.lo ** y, a.hi ** y]
    lo, hi = min(values), max(values)
    if y % 2 == 0 and a.lo < 0 < a.hi:
        lo = 0
    return Interval(lo, hi)


def _convert(eqn: Any, ins: list[Interval]) -> Interval:
    (a,) = ins
    kind = np.dtype(eqn.params["new_dtype"]).kind
    if kind == "b":
        if a.lo > 0 or a.hi < 0:
            return Interval.exact(1)
        return Interval.exact(0) if a.lo == a.hi == 0 else BOOL
    if kind in "iu":
        if not a.bounded:
            return UNBOUNDED
        return Interval(math.trunc(a.lo), math.trunc(a.hi))  # float -> int rounds to zero
    return a


def _compare(op: str) -> Callable[[Any, list[Interval]], Interval]:
    def rule(eqn: Any, ins: list[Interval]) -> Interval:
        a, b = ins
        if op == "lt":
            true, false = a.hi < b.lo, a.lo >= b.hi
        elif op == "le":
            true, false = a.hi <= b.lo, a.lo > b.hi
        elif op == "gt":
            true, false = a.lo > b.hi, a.hi <= b.lo
        elif op == "ge":
            true, false = a.lo >= b.hi, a.hi < b.lo
        else:
            same = a.is_exact and b.is_exact and a.lo == b.lo
            disjoint = a.hi < b.lo or b.hi < a.lo
            true, false = (same, disjoint) if op == "eq" else (disjoint, same)
        return Interval.exact(1) if true else Interval.exact(0) if false else BOOL
    return rule


def _logic(op: str) -> Callable[[Any, list[Interval]], Interval]:
    def rule(eqn: Any, ins: list[Interval]) -> Interval:
        if np.dtype(eqn.outvars[0].aval.dtype).kind == "b":
            if op == "not":
                (a,) = ins
                return Interval(1 - a.hi, 1 - a.lo)
            a, b = ins
            if op == "and":
                return Interval(min(a.lo, b.lo), min(a.hi, b.hi))
            if op == "or":
                return Interval(max(a.lo, b.lo), max(a.hi, b.hi))
            return BOOL
        if op == "not":
            (a,) = ins
            return Interval(-a.hi - 1, -a.lo - 1)  # ~x == -x - 1
        a, b = ins
        if a.lo < 0 or b.lo < 0 or not (a.bounded and b.bounded):
            return UNBOUNDED
        if op == "and":
            return Interval(0, min(a.hi, b.hi))
        return Interval(0, (1 << int(max(a.hi, b.hi)).bit_length()) - 1)
    return rule


def _shift(op: str) -> Callable[[Any, list[Interval]], Interval]:
    def rule(eqn: Any, ins: list[Interval]) -> Interval:
        a, b = ins
        bits = np.dtype(eqn.outvars[0].aval.dtype).itemsize * 8
        if not (a.bounded and b.bounded) or a.lo < 0 or b.lo < 0 or b.hi >= bits:
            return UNBOUNDED
        if op == "left":
            return Interval(int(a.lo) << int(b.lo), int(a.hi) << int(b.hi))
        return Interval(int(a.lo) >> int(b.hi), int(a.hi) >> int(b.lo))
    return rule


def _select_n(eqn: Any, ins: list[Interval]) -> Interval:
    which, cases = ins[0], ins[1:]
    lo = max(0, int(which.lo)) if math.isfinite(which.lo) else 0
    hi = min(len(cases) - 1, int(which.hi)) if math.isfinite(which.hi) else len(cases) - 1
    out = cases[lo]
    for c in cases[lo + 1:hi + 1]:
        out = out.join(c)
    return out


def _first(eqn: Any, ins: list[Interval]) -> Interval:
    return ins[0]


def _each(eqn: Any, ins: list[Interval]) -> list[Interval]:
    return list(ins[:len(eqn.outvars)])


def _join_all(eqn: Any, ins: list[Interval]) -> Interval:
    out = ins[0]
    for iv in ins[1:]:
        out = out.join(iv)
    return out


def _join_two(eqn: Any, ins: list[Interval]) -> Interval:
    return ins[0].join(ins[1])  # pad (operand, padding value); dynamic_update_slice; scatter


def _scatter(eqn: Any, ins: list[Interval]) -> Interval:
    return ins[0].join(ins[2])  # (operand, indices, updates)


def _index_range(eqn: Any, ins: list[Interval]) -> Interval:
    """argmax / argmin: an index along the reduced axis."""
    shape = eqn.invars[0].aval.shape
    return Interval(0, max(int(shape[eqn.params["axes"][0]]) - 1, 0))


def _iota(eqn: Any, ins: list[Interval]) -> Interval:
    return Interval(0, max(int(eqn.params["shape"][eqn.params["dimension"]]) - 1, 0))


def _reduce_sum(eqn: Any, ins: list[Interval]) -> Interval:
    (a,) = ins[:1]
    n = math.prod(eqn.invars[0].aval.shape) // max(math.prod(eqn.outvars[0].aval.shape), 1)
    return Interval(_mul(n, a.lo), _mul(n, a.hi))


def _cumsum(eqn: Any, ins: list[Interval]) -> Interval:
    (a,) = ins
    n = int(eqn.invars[0].aval.shape[eqn.params["axis"]])
    return Interval(min(a.lo, _mul(n, a.lo)), max(a.hi, _mul(n, a.hi)))


def _masked_load(eqn: Any, ins: list[Interval]) -> Interval:
    return _join_all(eqn, ins)  # the ref's values or `other` (indices joined in: still sound)


def _top_k(eqn: Any, ins: list[Interval]) -> list[Interval]:
    n = int(eqn.invars[0].aval.shape[-1])
    return [ins[0], Interval(0, max(n - 1, 0))]


def _floor_like(f: Callable[[float], float]) -> Callable[[Any, list[Interval]], Interval]:
    def rule(eqn: Any, ins: list[Interval]) -> Interval:
        (a,) = ins
        if not a.bounded:
            return UNBOUNDED
        return Interval(f(a.lo), f(a.hi))
    return rule


_PASS_THROUGH = (
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "gather", "rev", "copy", "copy_p", "reduce_precision", "multiple_of",
    "sharding_constraint", "reduce_max", "reduce_min", "cummax", "cummin", "get", "swap",
    "masked_swap",
    "real", "stop_gradient",
)
RULES: dict[str, Callable[[Any, list[Interval]], Interval | list[Interval]]] = {
    **{name: _first for name in _PASS_THROUGH},
    "add": _add, "add_any": _add, "sub": _sub,
    "mul": lambda e, ins: _corners(_mul, *ins),
    "div": _div, "rem": _rem, "max": _max, "min": _min, "clamp": _clamp,
    "neg": lambda e, ins: Interval(-ins[0].hi, -ins[0].lo),
    "abs": _abs, "sign": _sign, "integer_pow": _integer_pow,
    "square": lambda e, ins: _integer_pow(e, ins, 2),
    "convert_element_type": _convert, "select_n": _select_n,
    **{op: _compare(op) for op in ("lt", "le", "gt", "ge", "eq", "ne")},
    **{op: _logic(op) for op in ("and", "or", "xor", "not")},
    "shift_left": _shift("left"), "shift_right_logical": _shift("right"),
    "shift_right_arithmetic": _shift("right"),
    "floor": _floor_like(math.floor), "ceil": _floor_like(math.ceil),
    "round": _floor_like(round),
    "iota": _iota, "argmax": _index_range, "argmin": _index_range,
    "reduce_sum": _reduce_sum, "cumsum": _cumsum, "reduce_and": _first, "reduce_or": _first,
    "concatenate": _join_all, "pad": _join_two, "dynamic_update_slice": _join_two,
    "scatter": _scatter, "select_and_scatter_add": lambda e, ins: UNBOUNDED,
    "masked_load": _masked_load, "top_k": _top_k, "sort": _each,
    "optimization_barrier": _each, "device_put": _each, "split": lambda e, ins: [ins[0]] * len(e.outvars),
}
