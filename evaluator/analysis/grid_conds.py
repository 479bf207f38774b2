"""Which branch of each `pl.when` / `lax.cond` in a kernel body runs at each grid step.

A kernel's cost is its body's cost per grid step times the grid steps (evaluator/analysis/traffic.py).
A cond charged its dearest branch on every step lets a kernel claim work it never does: a
matmul whose dot runs only under `pl.when((i == 0) & (j == 0))` was credited the whole
task's FLOPs while doing 1/16 of them. Most predicates in honest kernels are functions of
the grid position alone (an accumulator's init at k == 0, its write-back at the last k,
causal block skipping), so they can be evaluated. This module evaluates every cond index
that depends only on program ids, num_programs, literals and constants at every grid point
at once (the body's equations computed over arrays of grid points: _GridEvaluator), and the cost
walker (evaluator/analysis/jaxpr_cost.py) charges each branch on the grid points where it is taken.
Inside a loop of known length (a `scan`, a `while` whose maximum trip count
evaluator/analysis/intervals.py found), the loop counter is evaluated too, at every iteration (so
`pl.when(i + t == 0)` in a one-trip loop is no way around the rule), and an iteration past a
while loop's end takes no branch. What is recorded per cond and branch is the share of
(grid point, loop iteration) pairs on which the branch runs, the enclosing decided conds'
conditions included, so nested `pl.when`s are exact. A predicate that reads anything else
(a ref, another loop carry, a prefetched scalar) is not evaluated: its cond keeps the dearest
branch (and, enclosing a decided cond, counts as always taken); but one anded with a decided
condition (`(i == 0) & (x_ref[0, 0] > 0)`) runs its branch at most where that holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, param_jaxprs

# Above this many grid points (times the iterations of the loops around a cond, for its
# loop counters) the predicates are not evaluated: the dearest branch counts.
MAX_GRID_POINTS = 1 << 22


@dataclass
class GridConds:
    """How often each grid-decided cond of a kernel body runs each of its branches."""

    steps: int  # grid points
    # id(cond eqn) -> [branches]: the share of (grid point, iteration of the loops around the
    # cond) pairs on which the branch runs; the enclosing decided conds' conditions and the
    # ends of while loops included. Times grid steps and trip counts: how many times it runs.
    share: dict[int, np.ndarray]


def grid_cond_branches(kernel_jaxpr: Any, grid: Sequence[int],
                       trips: Mapping[int, int | None] | None = None) -> GridConds | None:
    """The branches the conds of `kernel_jaxpr` (a pallas_call body) take at each grid point,
    for the conds whose index is a function of the grid position, loop counters and
    constants; `trips`: the while loops' maximum trip counts (intervals.kernel_loop_trips).
    None when the grid is dynamic or larger than MAX_GRID_POINTS, or the evaluation fails
    (every cond then keeps its dearest branch)."""
    grid = [int(g) for g in grid]
    if any(g < 1 for g in grid):
        return None
    steps = math.prod(grid)
    if steps > MAX_GRID_POINTS:
        return None
    evaluator = _GridEvaluator(grid, trips or {})
    try:
        with np.errstate(all="ignore"):  # int32 arithmetic wraps, as on the TPU
            evaluator.run(kernel_jaxpr, [None] * len(kernel_jaxpr.invars), None)
    except Exception:  # noqa: BLE001  (an odd body must not fail a grading: dearest branches)
        return None
    found: dict[int, np.ndarray] = {}
    dropped: set[int] = set()
    for key, value in zip(evaluator.keys, evaluator.values):
        value = np.asarray(value, np.float64)
        share = value.reshape(-1, value.shape[-1]).mean(axis=0)  # over the grid points
        if key in found and not np.allclose(found[key], share):
            dropped.add(key)  # one cond eqn reached twice with other values (a shared jaxpr)
        found.setdefault(key, share)
    return GridConds(steps, {k: v for k, v in found.items() if k not in dropped})


def branches_taken(kernel_jaxpr: Any, conds: GridConds | None) -> list[list[int] | None]:
    """For each cond of a kernel body, in body order (depth first): the branches it takes at
    some grid step (and loop iteration), None where the cond is not decided by the grid
    position (or nothing is). The coverage stage asks every branch bench sizes take to be taken
    by some run case (evaluator/analysis/coverage.py)."""
    out: list[list[int] | None] = []
    for eqn in kernel_jaxpr.eqns:
        if eqn.primitive.name == "cond":
            share = conds.share.get(id(eqn)) if conds is not None else None
            out.append(None if share is None else [b for b, s in enumerate(share) if s > 1e-12])
        for sub in param_jaxprs(eqn.params):
            out += branches_taken(sub.jaxpr if is_closed_jaxpr(sub) else sub, conds)
    return out


class _GridEvaluator:
    """Evaluates what it can of a kernel body from the program ids and loop counters; None
    marks a value that depends on anything else (refs, other loop carries, scratch, data).

    Every grid point (and, inside a loop, every iteration) is evaluated at once: a value is a
    numpy array over `batch`, the grid points flattened, with one leading axis per loop being
    evaluated (a value that does not depend on some of them broadcasts). Integer and boolean
    scalar ops, which are nearly all a predicate does, run as numpy computes them, exactly as
    lax defines them (_NUMPY_RULES); any other primitive is bound as jax binds it, vmapped over
    the batch. Tracing and compiling the body as one XLA program instead cost 30-50 ms a
    kernel, several times per grading."""

    def __init__(self, grid: Sequence[int], trips: Mapping[int, int | None]) -> None:
        self.grid = list(grid)
        self.trips = trips
        points = np.indices(self.grid).reshape(len(self.grid), -1) if self.grid else []
        self.program_ids: list[np.ndarray] = [p.astype(np.int32) for p in points]
        self.batch: tuple[int, ...] = (math.prod(self.grid),) if self.grid else ()
        self.keys: list[int] = []  # id(cond eqn), aligned with values
        self.values: list[np.ndarray] = []  # per cond: [*batch, branches], whether each runs
        self.path: Any = None  # the enclosing decided branches' conditions; None: always

    def run(self, jaxpr: Any, inputs: Sequence[Any], consts: Sequence[Any] | None) -> list[Any]:
        env: dict[Any, Any] = {}
        for v, c in zip(jaxpr.constvars, consts if consts is not None else ()):
            env[v] = c
        for v, x in zip(jaxpr.invars, inputs):
            if x is not None:
                env[v] = x
        read = lambda v: v.val if hasattr(v, "val") else env.get(v)  # noqa: E731  (Literal or Var)
        for eqn in jaxpr.eqns:
            try:
                outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            except Exception:  # noqa: BLE001  (a primitive that cannot run here: unknown)
                outs = [None] * len(eqn.outvars)
            for v, out in zip(eqn.outvars, outs):
                if out is not None:
                    env[v] = out
        return [read(v) for v in jaxpr.outvars]

    def eqn(self, eqn: Any, ins: list[Any]) -> list[Any]:
        name, n_out = eqn.primitive.name, len(eqn.outvars)
        unknown = [None] * n_out
        if name == "program_id":
            axis = eqn.params["axis"]
            return [self.program_ids[axis]] if axis < len(self.program_ids) else unknown
        if name == "num_programs":
            axis = eqn.params["axis"]
            return [np.int32(self.grid[axis])] if axis < len(self.grid) else unknown
        if name == "multiple_of":
            return [ins[0]]
        partial = self._partial(eqn, ins)
        if partial is not None:
            return [partial]
        subs = [_open(j) for j in param_jaxprs(eqn.params)]
        if name == "cond":
            index, operands = ins[0], ins[1:]
            outer = self.path
            branches = np.arange(len(subs))
            if isinstance(index, _Maybe):  # branch 0 anywhere, the others only where allowed
                runs = (branches == 0) | np.asarray(index.mask, bool)[..., None]
                self._record(eqn, runs if outer is None else runs & outer[..., None])
            elif index is not None:
                branch = np.clip(np.asarray(index).astype(np.int32), 0, len(subs) - 1)
                runs = branches == branch[..., None]
                self._record(eqn, runs if outer is None else runs & outer[..., None])
            try:
                for k, (jaxpr, consts) in enumerate(subs):
                    if index is not None:  # known, or _Maybe (an upper bound)
                        self.path = runs[..., k] if outer is None else runs[..., k] & outer
                    self.run(jaxpr, operands, consts)
            finally:
                self.path = outer
            return unknown
        if name == "while":
            self._while(eqn, ins)
            return unknown
        if name == "scan":
            self._scan(eqn, ins)
            return unknown
        if subs:
            if len(subs) == 1 and len(subs[0][0].invars) == len(ins) and len(subs[0][0].outvars) == n_out:
                return self.run(subs[0][0], ins, subs[0][1])  # a call: jit, custom_jvp, remat
            for jaxpr, consts in subs:  # run_scoped's fresh refs, anything else: inputs unknown
                self.run(jaxpr, [None] * len(jaxpr.invars), consts)
            return unknown
        # Predicates are scalars: an array (a mask from an iota) would be evaluated once per
        # grid point, [steps, *shape], for nothing.
        scalars = all(getattr(getattr(v, "aval", None), "shape", None) == () for v in eqn.outvars)
        if eqn.effects or not scalars or any(x is None or isinstance(x, _Maybe) for x in ins):
            return unknown
        return self._apply(eqn, ins)

    def _record(self, eqn: Any, runs: np.ndarray) -> None:
        self.keys.append(id(eqn))
        self.values.append(np.broadcast_to(runs, (*self.batch, runs.shape[-1])))

    def _apply(self, eqn: Any, ins: list[Any]) -> list[Any]:
        """One primitive with scalar outputs, at every point of the batch."""
        avals = [v.aval for v in eqn.invars]
        rule = _NUMPY_RULES.get(eqn.primitive.name)
        if rule is not None and all(a.shape == () and _exact(a.dtype) for a in avals) and all(
                _exact(v.aval.dtype) for v in eqn.outvars):
            try:
                out = rule(*[np.asarray(x, a.dtype) for x, a in zip(ins, avals)], **eqn.params)
            except Exception:  # noqa: BLE001  (parameters this rule does not know: as jax binds it)
                out = NotImplemented
            if out is not NotImplemented:
                return [np.asarray(out, eqn.outvars[0].aval.dtype)]
        import jax

        bind = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) in older jax
        subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
        size = math.prod(self.batch)
        args, axes = [], []
        for x, aval in zip(ins, avals):
            x = np.asarray(x)
            batched = x.ndim > len(aval.shape)  # a value over the batch, not a constant
            args.append(np.broadcast_to(x, (*self.batch, *aval.shape)).reshape(size, *aval.shape)
                        if batched else x)
            axes.append(0 if batched else None)

        def one(*xs: Any) -> Any:
            out = eqn.primitive.bind(*subfuns, *xs, **params)
            return list(out) if eqn.primitive.multiple_results else [out]

        if not any(a == 0 for a in axes):
            return [np.asarray(o) for o in one(*args)]
        outs = jax.vmap(one, in_axes=axes)(*args)
        return [np.asarray(o).reshape(*self.batch, *v.aval.shape) for o, v in zip(outs, eqn.outvars)]

    @staticmethod
    def _partial(eqn: Any, ins: list[Any]) -> "_Maybe | None":
        """A predicate known in part: `(i == 0) & x_ref[0, 0] > 0` can be true only where
        i == 0, whatever the data. Rules for `and`, `or` and casts of booleans."""
        name = eqn.primitive.name
        if name not in ("and", "or", "convert_element_type") or len(eqn.outvars) != 1:
            return None
        if not any(x is None or isinstance(x, _Maybe) for x in ins):
            return None  # fully known: bound as usual
        may = [x.mask if isinstance(x, _Maybe) else x for x in ins]
        try:
            boolean = np.dtype(eqn.outvars[0].aval.dtype) == np.bool_
        except (TypeError, AttributeError):
            return None
        if name == "convert_element_type" and isinstance(ins[0], _Maybe):
            return ins[0]  # false stays 0, and 0 stays false
        if not boolean or eqn.outvars[0].aval.shape != ():
            return None
        if name == "and":
            known = [m for m in may if m is not None]
            if not known:
                return None
            out = known[0]
            for m in known[1:]:
                out = out & m
            return _Maybe(out)
        if name == "or" and all(m is not None for m in may):
            return _Maybe(may[0] | may[1])
        return None

    # -- loops: the counter at every iteration -----------------------------------------------
    def _scan(self, eqn: Any, ins: list[Any]) -> None:
        p = eqn.params
        (body, consts), = [_open(p["jaxpr"])]
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        counters = _counters(body, n_consts, n_carry, ins[n_consts:n_consts + n_carry])
        n_xs = len(ins) - n_consts - n_carry

        def iteration(carries: list[Any]) -> Any:
            self.run(body, [*ins[:n_consts], *carries, *[None] * n_xs], consts)
            return None  # every iteration that starts runs its body

        self._iterate(int(p["length"]), counters, n_carry, iteration,
                      lambda: self.run(body, [*ins[:n_consts], *[None] * (len(ins) - n_consts)], consts))

    def _while(self, eqn: Any, ins: list[Any]) -> None:
        p = eqn.params
        n_cc, n_bc = p["cond_nconsts"], p["body_nconsts"]
        (cond, cond_consts), (body, body_consts) = _open(p["cond_jaxpr"]), _open(p["body_jaxpr"])
        init = ins[n_cc + n_bc:]
        counters = _counters(body, n_bc, len(init), init)

        def iteration(carries: list[Any]) -> Any:
            alive = self.run(cond, [*ins[:n_cc], *carries], cond_consts)[0]
            self.run(body, [*ins[n_cc:n_cc + n_bc], *carries], body_consts)
            return alive  # an iteration past the loop's end runs nothing

        def unknown() -> None:
            self.run(cond, [*ins[:n_cc], *[None] * len(init)], cond_consts)
            self.run(body, [*ins[n_cc:n_cc + n_bc], *[None] * len(init)], body_consts)

        self._iterate(self.trips.get(id(eqn)) or 0, counters, len(init), iteration, unknown)

    def _iterate(self, length: int, counters: dict[int, tuple[Any, Any]], n_carry: int,
                 iteration: Any, unknown: Any) -> None:
        """Run a loop body for all `length` iterations at once (a new leading axis of the
        batch), its counters (carry -> (init, step)) set per iteration and its other carries
        unknown; each cond inside runs a branch where some live iteration does. Without
        counters, a known length, or room under MAX_GRID_POINTS: once, every carry unknown."""
        if not counters or length < 1 or math.prod(self.batch) * length > MAX_GRID_POINTS:
            unknown()
            return
        first = len(self.values)
        outer = self.batch
        t = np.arange(length, dtype=np.int32).reshape(length, *[1] * len(outer))
        carries = [counters[k][0] + t * counters[k][1] if k in counters else None for k in range(n_carry)]
        self.batch = (length, *outer)
        try:
            alive = iteration(carries)
        finally:
            self.batch = outer
        found = [np.asarray(v, np.float32) for v in self.values[first:]]
        if alive is not None:  # the iteration runs only while the loop's test holds
            alive = np.broadcast_to(np.asarray(alive, np.float32), (length, *outer))[..., None]
            found = [v * alive for v in found]
        # Per cond and branch: the share of the `length` iterations on which it runs.
        self.values[first:] = [v.mean(axis=0) for v in found]


@dataclass
class _Maybe:
    """A scalar predicate that is false (0) wherever `mask` is false, and unknown elsewhere."""

    mask: Any


def _counters(body: Any, n_consts: int, n_carry: int, init: Sequence[Any]) -> dict[int, tuple[Any, Any]]:
    """Carries the body advances by a constant (`i + 1`, fori_loop's counter) or returns
    unchanged, and whose start is known: carry index -> (start, step)."""
    producers = {id(v): e for e in body.eqns for v in e.outvars}
    out = {}
    for k in range(n_carry):
        carry, producer = body.invars[n_consts + k], producers.get(id(body.outvars[k]))
        if carry.aval.shape != ():
            continue  # a counter is a scalar; the batch holds no per-point arrays
        if init[k] is not None and body.outvars[k] is carry:
            out[k] = (init[k], 0)  # carried unchanged: fori_loop's upper bound
            continue
        if init[k] is None or producer is None or producer.primitive.name not in ("add", "sub"):
            continue
        a, b = producer.invars
        other = b if a is carry else a if (b is carry and producer.primitive.name == "add") else None
        if other is None or not hasattr(other, "val") or np.shape(other.val) != ():
            continue
        step = other.val if producer.primitive.name == "add" else -other.val
        out[k] = (init[k], step)
    return out


def _open(j: Any) -> tuple[Any, Any]:
    return (j.jaxpr, j.consts) if is_closed_jaxpr(j) else (j, None)


# --- scalar integer and boolean ops, as lax defines them -----------------------------------
def _exact(dtype: Any) -> bool:
    """Integers and booleans: numpy computes their ops bit for bit as XLA does."""
    return np.dtype(dtype).kind in "biu"


def _truncating_div(a: np.ndarray, b: np.ndarray) -> Any:
    """lax.div on integers rounds toward zero; x / 0 and INT_MIN / -1 are XLA's to define."""
    if np.any(b == 0) or (a.dtype.kind == "i" and np.any((a == np.iinfo(a.dtype).min) & (b == -1))):
        return NotImplemented
    q = a // b
    return q + ((q * b != a) & ((a < 0) != (b < 0)))


def _remainder(a: np.ndarray, b: np.ndarray) -> Any:
    """lax.rem on integers takes the dividend's sign (C's %)."""
    return NotImplemented if np.any(b == 0) else np.fmod(a, b)


def _shift(op: Any, logical: bool = False) -> Any:
    def rule(a: np.ndarray, b: np.ndarray) -> Any:
        bits = a.dtype.itemsize * 8
        if np.any((b < 0) | (b >= bits)) or (a.dtype.kind == "u" and op is np.right_shift and not logical):
            return NotImplemented  # out-of-range shifts are XLA's to define
        if logical and a.dtype.kind == "i":
            unsigned = np.dtype(f"u{a.dtype.itemsize}")
            return np.right_shift(a.astype(unsigned), b.astype(unsigned)).astype(a.dtype)
        return op(a, b)
    return rule


_NUMPY_RULES: dict[str, Any] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": _truncating_div, "rem": _remainder,
    "max": lambda a, b: np.maximum(a, b), "min": lambda a, b: np.minimum(a, b),
    "neg": lambda a: -a, "abs": lambda a: np.abs(a), "sign": lambda a: np.sign(a),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "not": lambda a: ~a,
    "select_n": lambda which, *cases: np.choose(which.astype(np.intp), cases, mode="clip"),
    "clamp": lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
    "convert_element_type": lambda a, new_dtype, **_: a.astype(new_dtype),
    "integer_pow": lambda a, y: NotImplemented if y < 0 else a ** y,
    "shift_left": _shift(np.left_shift), "shift_right_arithmetic": _shift(np.right_shift),
    "shift_right_logical": _shift(np.right_shift, logical=True),
    "copy": lambda a: a, "copy_p": lambda a: a,
}
