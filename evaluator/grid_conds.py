"""Which branch of each `pl.when` / `lax.cond` in a kernel body runs at each grid step.

A kernel's cost is its body's cost per grid step times the grid steps (evaluator/traffic.py).
A cond charged its dearest branch on every step lets a kernel claim work it never does: a
matmul whose dot runs only under `pl.when((i == 0) & (j == 0))` was credited the whole
task's FLOPs while doing 1/16 of them. Most predicates in honest kernels are functions of
the grid position alone (an accumulator's init at k == 0, its write-back at the last k,
causal block skipping), so they can be evaluated. This module evaluates every cond index
that depends only on program ids, num_programs, literals and constants at every grid point
at once (the body's equations bound under `jax.vmap` over the index grid), and the cost
walker (evaluator/jaxpr_cost.py) charges each branch on the grid points where it is taken.
Inside a loop of known length (a `scan`, a `while` whose maximum trip count
evaluator/intervals.py found), the loop counter is evaluated too, at every iteration (so
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

from evaluator.jaxpr_walk import is_closed_jaxpr, param_jaxprs
from evaluator.program import INTERPRET_COMPILE_OPTIONS

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
    import jax

    grid = [int(g) for g in grid]
    if any(g < 1 for g in grid):
        return None
    steps = math.prod(grid)
    if steps > MAX_GRID_POINTS:
        return None
    points = np.indices(grid).reshape(len(grid), -1).astype(np.int32) if grid else []
    evaluator = _GridEvaluator(grid, steps, trips or {})

    def predicates(*program_ids: Any) -> list[Any]:
        evaluator.program_ids = list(program_ids)
        evaluator.run(kernel_jaxpr, [None] * len(kernel_jaxpr.invars), None)
        return evaluator.values

    try:
        # Traced and compiled as one program: bound eagerly, every primitive of every body
        # was an XLA compile of its own (120 of them, 2.6 s, for attention_bwd's kernels). A
        # few scalar ops per grid point: compiled as cheaply as the interpret-mode programs.
        values = jax.jit(jax.vmap(predicates) if grid else predicates,
                         compiler_options=INTERPRET_COMPILE_OPTIONS)(*points)
    except Exception:  # noqa: BLE001  (an odd body must not fail a grading: dearest branches)
        return None
    found: dict[int, np.ndarray] = {}
    dropped: set[int] = set()
    for key, value in zip(evaluator.keys, values):
        value = np.asarray(value, np.float64)
        share = value.reshape(-1, value.shape[-1]).mean(axis=0)  # over the grid points
        if key in found and not np.allclose(found[key], share):
            dropped.add(key)  # one cond eqn reached twice with other values (a shared jaxpr)
        found.setdefault(key, share)
    return GridConds(steps, {k: v for k, v in found.items() if k not in dropped})


class _GridEvaluator:
    """Evaluates what it can of a kernel body from the program ids and loop counters; None
    marks a value that depends on anything else (refs, other loop carries, scratch, data)."""

    def __init__(self, grid: Sequence[int], steps: int, trips: Mapping[int, int | None]) -> None:
        self.grid = list(grid)
        self.trips = trips
        self.program_ids: list[Any] = []
        self.points = steps  # grid points times the iterations being evaluated at once
        self.keys: list[int] = []  # id(cond eqn), aligned with values
        self.values: list[Any] = []  # per cond: [branches], whether (how often) each runs
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
        import jax.numpy as jnp

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
            if isinstance(index, _Maybe):  # branch 0 anywhere, the others only where allowed
                runs = (jnp.arange(len(subs)) == 0) | index.mask
                self.keys.append(id(eqn))
                self.values.append(runs if outer is None else runs & outer)
            elif index is not None:
                branch = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(subs) - 1)
                runs = jnp.arange(len(subs)) == branch
                self.keys.append(id(eqn))
                self.values.append(runs if outer is None else runs & outer)
            try:
                for k, (jaxpr, consts) in enumerate(subs):
                    if index is not None:  # known, or _Maybe (an upper bound)
                        self.path = runs[k] if outer is None else runs[k] & outer
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
        bind = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) in older jax
        subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
        out = eqn.primitive.bind(*subfuns, *ins, **params)
        return list(out) if eqn.primitive.multiple_results else [out]

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
        """Run a loop body for all `length` iterations at once (vmapped over the iteration),
        its counters (carry -> (init, step)) set per iteration and its other carries unknown;
        each cond inside runs a branch where some live iteration does. Without counters, a
        known length, or room under MAX_GRID_POINTS: once, every carry unknown."""
        import jax
        import jax.numpy as jnp

        if not counters or length < 1 or self.points * length > MAX_GRID_POINTS:
            unknown()
            return
        first = len(self.values)

        def at(t: Any) -> list[Any]:
            carries = [counters[k][0] + t * counters[k][1] if k in counters else None
                       for k in range(n_carry)]
            alive = iteration(carries)
            found = self.values[first:]
            if alive is not None:  # the iteration runs only while the loop's test holds
                found = [jnp.asarray(v, jnp.float32) * jnp.asarray(alive, jnp.float32) for v in found]
            return found

        outer, self.points = self.points, self.points * length
        try:
            found = jax.vmap(at)(jnp.arange(length, dtype=jnp.int32))
        finally:
            self.points = outer
        # Per cond and branch: the share of the `length` iterations on which it runs.
        self.values[first:] = [jnp.mean(jnp.asarray(v, jnp.float32), axis=0) for v in found]


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
