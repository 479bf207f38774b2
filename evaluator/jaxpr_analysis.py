"""Read a traced program: where its pallas_calls are and what runs outside them.

Runs in the worker on the candidate's jaxpr and in the host on the reference's jaxpr; it
returns plain dataclasses so the verdict logic never touches jax objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from evaluator import intervals
from evaluator.jaxpr_walk import sub_jaxprs

# Rationale: a matmul or convolution outside a kernel *is* the task for most of the suite,
# whatever its size, so it is refused outright rather than weighed by cost.
HEAVY_PRIMITIVES = frozenset({
    "dot_general", "conv_general_dilated", "ragged_dot", "ragged_dot_general", "ragged_all_to_all",
})
# Rationale: work on the host escapes the kernel entirely (and breaks on real TPUs).
CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback", "debug_callback", "callback"})
# Moving or re-typing data costs bytes, not FLOPs: the glue an honest wrapper needs.
DATA_MOVEMENT_PRIMITIVES = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "pad", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "squeeze", "expand_dims", "convert_element_type",
    "copy", "copy_p", "select_n", "iota", "gather", "rev", "bitcast_convert_type",
    "reduce_precision", "device_put", "split", "sharding_constraint", "stop_gradient",
    "optimization_barrier", "pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint", "name", "empty",
    # Inside kernels: loads and stores of refs (VMEM/SMEM <-> registers), lane rotations,
    # bitcasts and grid queries. Counted as arithmetic, a kernel that only loads a block and
    # stores zeros would score 2 FLOPs per element, 40% of a softmax's.
    "get", "swap", "masked_load", "masked_swap", "roll", "bitcast", "multiple_of",
    "program_id", "num_programs",
})
TRANSCENDENTAL_PRIMITIVES = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "rsqrt",
    "sqrt", "cbrt", "pow", "erf", "erfc", "erf_inv", "atan2", "asin", "acos", "atan", "sinh",
    "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma",
})
# Reductions and scans cost one op per *input* element rather than per output element.
REDUCTION_PRIMITIVES = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
    "reduce", "reduce_precision_sum",
})


@dataclass
class BlockInfo:
    role: str  # "in" or "out"
    array_shape: list[int]
    block_shape: list[int]
    dtype: str
    memory_space: str  # "vmem" (pipelined), "any", "smem", ...
    buffer_count: int  # buffers the Pallas pipeline allocates for it
    fetches: int | None = None  # block copies over the whole grid (traffic analysis only)


@dataclass
class PallasCallInfo:
    name: str
    grid: list[int]
    blocks: list[BlockInfo]
    scratch: list[tuple[list[int], str, str]]  # (shape, dtype, memory space)
    num_scalar_prefetch: int
    dimension_semantics: list[str] | None
    vmem_limit_bytes: int | None
    kernel_primitives: list[str]
    flops_per_step: float = 0.0       # traffic analysis only
    f32_matmul_flops_per_step: float = 0.0  # of flops_per_step: matmuls on float32 operands
    dma_bytes_per_step: float = 0.0   # traffic analysis only
    # A while loop in the body has no known maximum trip count and was counted once, so
    # flops_per_step and dma_bytes_per_step are lower bounds (traffic analysis only).
    data_dependent_trips: bool = False
    runs: float = 1.0  # times the call runs: trip counts of the loops around it, outside kernels

    @property
    def grid_steps(self) -> int:
        return math.prod(max(g, 1) for g in self.grid) if self.grid else 1

    @property
    def flops(self) -> float:
        """FLOPs of every run of the kernel (traffic analysis only, else 0)."""
        return self.flops_per_step * self.grid_steps * self.runs

    @property
    def f32_matmul_flops(self) -> float:
        """Of `flops`: matmul FLOPs on float32 operands (slower on the MXU than bf16)."""
        return self.f32_matmul_flops_per_step * self.grid_steps * self.runs


@dataclass
class OutsideCost:
    """Estimated cost of everything outside pallas_calls."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    # Of `flops`: matmuls and convolutions (MXU work), and those whose operands are float32,
    # which the performance model runs at the f32 matmul rate (evaluator/hardware.py).
    matmul_flops: float = 0.0
    f32_matmul_flops: float = 0.0
    heavy_ops: list[str] = field(default_factory=list)
    callbacks: list[str] = field(default_factory=list)
    top_ops: dict[str, float] = field(default_factory=dict)  # primitive -> flops, for feedback
    # A while loop with no known maximum trip count was counted once: flops are a lower bound.
    data_dependent_trips: bool = False


@dataclass
class TraceSummary:
    pallas_calls: list[PallasCallInfo]
    outside: OutsideCost
    out_shapes: list[tuple[list[int], str]]

    @property
    def kernel_flops(self) -> float:
        """FLOPs inside all kernels (flops per grid step x grid steps x runs, summed), to set
        against the reference's; 0 unless summarize ran with traffic=True."""
        return sum(call.flops for call in self.pallas_calls)


def summarize(closed_jaxpr: Any, traffic: bool = False,
              arg_bounds: Sequence[Sequence[int] | None] | None = None) -> TraceSummary:
    """Summarise a ClosedJaxpr from `jax.make_jaxpr`; `traffic` adds what each kernel moves
    and computes (evaluator/traffic.py), for the performance model at bench sizes.

    `arg_bounds`, aligned with the jaxpr's invars (kernel()'s arguments), gives inclusive
    (lo, hi) bounds of integer inputs or None (`Task.arg_bounds(case)`). They reach each
    kernel's scalar-prefetch operands, so that loops whose trip count depends on that data
    count at their maximum (evaluator/intervals.py); without them such loops count once."""
    bounds = intervals.analyze_program(closed_jaxpr, arg_bounds)
    calls: list[tuple[Any, float]] = []
    cost = OutsideCost()
    _walk(closed_jaxpr.jaxpr, 1.0, calls, cost, trips=bounds.loop_trips)
    outs = [(list(v.aval.shape), str(v.aval.dtype)) for v in closed_jaxpr.jaxpr.outvars]
    infos = [_pallas_info(e, traffic, runs, bounds.pallas_operands.get(id(e))) for e, runs in calls]
    return TraceSummary(infos, cost, outs)


def dot_flops(eqn: Any) -> float:
    """2 * output size * contracted size, the usual multiply-add count."""
    if eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs_shape = eqn.invars[0].aval.shape
        contracted = math.prod(lhs_shape[d] for d in lhs_contract)
        return 2.0 * _size(eqn.outvars[0].aval) * contracted
    if eqn.primitive.name.startswith("ragged_dot"):
        lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        return 2.0 * lhs[0] * lhs[-1] * rhs[-1]
    if eqn.primitive.name == "conv_general_dilated":
        return conv_flops(eqn)
    return 2.0 * sum(_size(v.aval) for v in eqn.outvars)  # a lower bound for anything else


def conv_flops(eqn: Any) -> float:
    """2 * output size * (kernel window x input features per group): each output element is
    a dot product over the kernel's window and its group's input features, i.e. over every
    rhs element but the output-feature axis. (Taps that fall on padding count too, as in
    XLA's cost analysis.)"""
    rhs_shape = eqn.invars[1].aval.shape
    rhs_spec = eqn.params["dimension_numbers"].rhs_spec  # (out features, in features, *window)
    per_output = math.prod(rhs_shape) // max(int(rhs_shape[rhs_spec[0]]), 1)
    return 2.0 * _size(eqn.outvars[0].aval) * per_output


def total_cost(closed_jaxpr: Any,
               arg_bounds: Sequence[Sequence[int] | None] | None = None) -> OutsideCost:
    """What a whole program with no kernels (the reference) computes, matmuls included."""
    bounds = intervals.analyze_program(closed_jaxpr, arg_bounds)
    return walk_cost(closed_jaxpr.jaxpr, bounds.loop_trips)


def total_flops(closed_jaxpr: Any,
                arg_bounds: Sequence[Sequence[int] | None] | None = None) -> float:
    """FLOPs of a whole program with no kernels (the reference), matmuls included."""
    return total_cost(closed_jaxpr, arg_bounds).flops


def walk_cost(jaxpr: Any, trips: Mapping[int, int | None] | None = None) -> OutsideCost:
    """Everything a jaxpr computes, matmuls included (a kernel body), with while loops at the
    trip counts in `trips` (id(eqn) -> maximum trips, evaluator/intervals.py)."""
    cost = OutsideCost()
    _walk(jaxpr, 1.0, [], cost, count_heavy=True, trips=trips)
    return cost


def _walk(jaxpr: Any, mult: float, calls: list[tuple[Any, float]], cost: OutsideCost,
          count_heavy: bool = False, trips: Mapping[int, int | None] | None = None) -> None:
    """Cost everything outside pallas_calls into `cost`; collect the pallas_call eqns with
    the number of times each runs."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            calls.append((eqn, mult))
            continue
        if name in CALLBACK_PRIMITIVES:
            cost.callbacks.append(name)
            continue
        sub = list(sub_jaxprs(eqn))
        if sub:
            count, known = trip_count(eqn, trips)
            cost.data_dependent_trips |= not known
            inner_mult = mult * count
            if name == "cond":  # one branch runs: charge the dearest
                branch_costs = []
                for j in sub:
                    c = OutsideCost()
                    _walk(j, inner_mult, calls, c, count_heavy, trips)
                    branch_costs.append(c)
                worst = max(branch_costs, key=lambda c: c.flops)
                _merge(cost, worst, branch_costs)
            else:
                for j in sub:
                    _walk(j, inner_mult, calls, cost, count_heavy, trips)
            continue
        if not _is_free(eqn):
            nbytes = sum(_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval"))
            cost.bytes_accessed += mult * nbytes
        if name in HEAVY_PRIMITIVES:
            if count_heavy:
                flops = mult * dot_flops(eqn)
                cost.flops += flops
                cost.matmul_flops += flops
                if any(str(getattr(v.aval, "dtype", "")) == "float32" for v in eqn.invars[:2]):
                    cost.f32_matmul_flops += flops
            else:
                cost.heavy_ops.append(name)
            continue
        if name in DATA_MOVEMENT_PRIMITIVES:
            continue
        if name in REDUCTION_PRIMITIVES:
            flops = sum(_size(v.aval) for v in eqn.invars if hasattr(v, "aval"))
        else:
            flops = sum(_size(v.aval) for v in eqn.outvars)
        cost.flops += mult * flops
        cost.top_ops[name] = cost.top_ops.get(name, 0.0) + mult * flops
        if name in TRANSCENDENTAL_PRIMITIVES:
            cost.transcendentals += mult * flops


def _is_free(eqn: Any) -> bool:
    """Ops XLA turns into nothing: reshapes, and pads/slices/casts that change nothing."""
    if eqn.primitive.name in ("reshape", "squeeze", "expand_dims"):
        return True
    ins = [v.aval for v in eqn.invars if hasattr(v, "aval")]
    outs = [v.aval for v in eqn.outvars]
    return (eqn.primitive.name in DATA_MOVEMENT_PRIMITIVES and len(outs) == 1 and bool(ins)
            and getattr(ins[0], "shape", None) == outs[0].shape and ins[0].dtype == outs[0].dtype)


def _merge(into: OutsideCost, worst: OutsideCost, all_costs: list[OutsideCost]) -> None:
    into.flops += worst.flops
    into.matmul_flops += worst.matmul_flops
    into.f32_matmul_flops += worst.f32_matmul_flops
    into.transcendentals += worst.transcendentals
    into.bytes_accessed += worst.bytes_accessed
    for op, f in worst.top_ops.items():
        into.top_ops[op] = into.top_ops.get(op, 0.0) + f
    for c in all_costs:  # a heavy op or callback in any branch counts
        into.heavy_ops.extend(c.heavy_ops)
        into.callbacks.extend(c.callbacks)
        into.data_dependent_trips |= c.data_dependent_trips


def trip_count(eqn: Any, trips: Mapping[int, int | None] | None = None) -> tuple[float, bool]:
    """(times the sub-jaxprs of eqn run, whether that is known). A scan runs `length` times;
    a while loop its maximum trip count from `trips` (evaluator/intervals.py), else once,
    unknown; anything else (cond, calls) once."""
    if eqn.primitive.name == "scan":
        return float(eqn.params.get("length", 1)), True
    if eqn.primitive.name == "while":
        n = (trips or {}).get(id(eqn))
        return (1.0, False) if n is None else (float(n), True)
    return 1.0, True


def _pallas_info(eqn: Any, traffic: bool = False, runs: float = 1.0,
                 operand_bounds: list[intervals.Interval] | None = None) -> PallasCallInfo:
    from evaluator import traffic as traffic_analysis

    gm = eqn.params["grid_mapping"]
    grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1 for g in gm.grid)
    static_grid = all(g >= 0 for g in grid)
    # A grid dimension given by a traced value (megablox gmm's active tiles) counts at the
    # bound of that operand where one is known; else it stays -1 (one step, a lower bound).
    grid, unbounded_grid = _bounded_grid(grid, operand_bounds)
    n_in = gm.num_inputs
    blocks = []
    for i, bm in enumerate(gm.block_mappings):
        aval = bm.array_aval
        blocks.append(BlockInfo(
            role="in" if i < n_in else "out",
            array_shape=[int(d) for d in aval.shape],
            block_shape=[_block_dim(b) for b in bm.block_shape],
            dtype=str(aval.dtype),
            memory_space=_memory_space(bm.block_aval),
            buffer_count=_buffer_count(bm),
            fetches=traffic_analysis.block_fetches(bm, grid) if traffic and static_grid else None,
        ))
    scratch = []
    for aval in gm.scratch_avals:
        inner = getattr(aval, "inner_aval", aval)
        shape = [int(d) for d in getattr(inner, "shape", ())]
        scratch.append((shape, str(getattr(inner, "dtype", "")), _memory_space(aval)))
    params = eqn.params.get("compiler_params")
    if isinstance(params, dict):  # older jax: {"mosaic_tpu": CompilerParams(...)}
        params = params.get("mosaic_tpu") or params.get("mosaic")
    semantics = getattr(params, "dimension_semantics", None)
    kernel_jaxpr = eqn.params["jaxpr"]
    step = traffic_analysis.StepCost()
    if traffic:
        step = traffic_analysis.kernel_cost_per_step(
            kernel_jaxpr, intervals.kernel_loop_trips(eqn, operand_bounds))
    return PallasCallInfo(
        name=_kernel_name(eqn),
        grid=list(grid),
        blocks=blocks,
        scratch=scratch,
        num_scalar_prefetch=int(gm.num_index_operands),
        dimension_semantics=[_semantics_name(s) for s in semantics] if semantics else None,
        vmem_limit_bytes=getattr(params, "vmem_limit_bytes", None),
        kernel_primitives=sorted(_all_primitives(kernel_jaxpr)),
        flops_per_step=step.flops,
        f32_matmul_flops_per_step=step.f32_matmul_flops,
        dma_bytes_per_step=step.dma_bytes,
        data_dependent_trips=step.data_dependent_trips or unbounded_grid,
        runs=runs,
    )


def _bounded_grid(grid: tuple[int, ...], operand_bounds: list[intervals.Interval] | None
                  ) -> tuple[tuple[int, ...], bool]:
    """Dynamic grid dimensions (-1) replaced by their operands' upper bounds (the leading
    pallas_call operands, one per dynamic dimension, in order); True when one has none."""
    bounds = iter(operand_bounds or ())
    out, unbounded = [], False
    for g in grid:
        if g >= 0:
            out.append(g)
            continue
        hi = getattr(next(bounds, None), "hi", None)
        if hi is None or not math.isfinite(hi):
            out.append(-1)
            unbounded = True
        else:
            out.append(max(int(hi), 1))
    return tuple(out), unbounded


def _kernel_name(eqn: Any) -> str:
    """The kernel body's function name ("matmul_kernel"), for feedback."""
    if eqn.params.get("name"):
        return str(eqn.params["name"])
    info = getattr(eqn.params["jaxpr"], "debug_info", None)
    src = getattr(info, "func_src_info", None) or ""
    return src.split(" at ")[0] or "kernel"


def _all_primitives(jaxpr: Any) -> set[str]:
    names: set[str] = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in sub_jaxprs(eqn):
            names |= _all_primitives(sub)
    return names


def _semantics_name(s: Any) -> str:
    text = str(getattr(s, "name", s)).lower()
    return text.split(".")[-1]


def _block_dim(b: Any) -> int:
    if b is None:
        return 1
    if isinstance(b, (int, np.integer)):
        return int(b)
    return int(getattr(b, "block_size", 1))


def _memory_space(aval: Any) -> str:
    space = getattr(aval, "memory_space", None)
    text = str(space).lower() if space is not None else "vmem"
    for known in ("vmem", "smem", "any", "hbm", "semaphore", "sem"):
        if known in text:
            return known
    return "vmem"  # "default": the pipeline puts blocks in VMEM on TPU


def _buffer_count(bm: Any) -> int:
    mode = getattr(bm, "pipeline_mode", None)
    count = getattr(mode, "buffer_count", None)
    return int(count) if count else 2  # Pallas double-buffers blocked operands by default


def _size(aval: Any) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def _nbytes(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 4
    return _size(aval) * itemsize
