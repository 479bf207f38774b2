"""What a jaxpr computes: FLOPs (matmul FLOPs apart), transcendentals, bytes, the bytes a
kernel body copies by its own DMAs, and where a program runs heavy ops or host callbacks.

The one cost walker of the project: the structure analysis (evaluator/analysis/jaxpr_analysis.py)
runs it over the glue outside kernels, the traffic model (evaluator/analysis/traffic.py) over each
kernel body, the reference cache (evaluator/truth/reference.py) over whole references. Loops count
their trip counts (a while loop its maximum, from evaluator/analysis/intervals.py, else once and
flagged), a cond its dearest branch, or in a kernel body, where its predicate depends on
the grid position and loop counters alone, each branch on the grid steps (and iterations)
that take it (evaluator/analysis/grid_conds.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from evaluator.analysis import intervals
from evaluator.analysis.grid_conds import GridConds
from evaluator.analysis.jaxpr_walk import sub_jaxprs

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
# Inside kernels: the accesses TPU interpret mode serves with a host callback each, what its
# run time follows (evaluator/execution/step_limits.py).
MEMORY_ACCESS_PRIMITIVES = frozenset({
    "get", "swap", "load", "masked_load", "masked_swap", "addupdate", "dma_start", "dma_wait",
    "semaphore_signal", "semaphore_wait", "semaphore_read",
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
class Cost:
    """What a piece of a program computes (the glue outside kernels, one step of a kernel
    body, or a whole reference)."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    # Of `flops`: matmuls and convolutions (MXU work), and those whose operands are float32,
    # which the performance model runs at the f32 matmul rate (evaluator/performance/hardware.py).
    matmul_flops: float = 0.0
    f32_matmul_flops: float = 0.0
    dma_bytes: float = 0.0  # inside kernels: bytes copied by the body's own DMAs
    accesses: float = 0.0   # inside kernels: memory accesses (MEMORY_ACCESS_PRIMITIVES) made
    heavy_ops: list[str] = field(default_factory=list)  # matmuls seen when not counted as work
    callbacks: list[str] = field(default_factory=list)
    top_ops: dict[str, float] = field(default_factory=dict)  # primitive -> flops, for feedback
    # A while loop with no known maximum trip count was counted once: flops are a lower bound.
    data_dependent_trips: bool = False
    # Matmuls and convolutions listed in `heavy_ops` (not counted as work): their FLOPs, which
    # the speed prediction still prices (evaluator/performance/prediction.py).
    heavy_flops: float = 0.0
    # Of the FLOPs above (counted or heavy): convolutions; of those, the taps on the zeros a
    # transposed convolution's lhs dilation inserts (neither XLA's count nor the chip does them);
    # and the rest as the MXU runs them, feature dims padded to its 128-wide tiles. The speed
    # prediction prices convolutions by the last (evaluator/performance/prediction.py).
    conv_flops: float = 0.0
    conv_skipped_flops: float = 0.0
    conv_mxu_flops: float = 0.0
    # The extra MXU passes of dots whose precision asks for more than one (HIGH: 3 bf16 passes,
    # HIGHEST: 6) on float32 operands that are not bf16 values cast up: 2 or 5 times their
    # FLOPs, counted or heavy. XLA's cost model and our roofline price a dot once.
    multipass_flops: float = 0.0
    # Beyond flops and multipass_flops: what dots' operands padded to whole MXU tiles cost
    # (dot_tile_padding). Read for kernel bodies only: XLA's cost model prices the glue's dots.
    mxu_padding_flops: float = 0.0
    # Iterations of scans and while loops (nested ones times their enclosing loops'): each
    # costs a TPU a fixed overhead that XLA's cost model leaves out (evaluator/performance/xla_cost.py).
    loop_iterations: float = 0.0


PallasCallSink = Callable[[Any, float], None]


def walk(jaxpr: Any, trips: Mapping[int, int | None] | None = None, count_heavy: bool = True,
         on_pallas_call: PallasCallSink | None = None, grid_conds: GridConds | None = None) -> Cost:
    """The cost of an open jaxpr. `count_heavy=False` lists matmuls in `heavy_ops` instead of
    counting them (outside kernels they are refused, not weighed); `on_pallas_call(eqn,
    runs)` receives each pallas_call with the number of times it runs (not walked into).
    `grid_conds` (a kernel body's, evaluator/analysis/grid_conds.py): the conds whose branch is known
    at every grid point charge each branch on the share of grid points taking it, so the cost
    is the mean over grid steps."""
    cost = Cost()
    reach = None if grid_conds is None else _Reach(grid_conds)
    _walk(jaxpr, 1.0, cost, count_heavy, trips, on_pallas_call, reach)
    return cost


def total_cost(closed_jaxpr: Any,
               arg_bounds: Sequence[Sequence[int] | None] | None = None) -> Cost:
    """What a whole program with no kernels (the reference) computes, matmuls included."""
    bounds = intervals.analyze_program(closed_jaxpr, arg_bounds)
    return walk(closed_jaxpr.jaxpr, bounds.loop_trips)


def total_flops(closed_jaxpr: Any,
                arg_bounds: Sequence[Sequence[int] | None] | None = None) -> float:
    """FLOPs of a whole program with no kernels (the reference), matmuls included."""
    return total_cost(closed_jaxpr, arg_bounds).flops


def dot_flops(eqn: Any) -> float:
    """2 * output size * contracted size, the usual multiply-add count."""
    if eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs_shape = eqn.invars[0].aval.shape
        contracted = math.prod(lhs_shape[d] for d in lhs_contract)
        return 2.0 * aval_size(eqn.outvars[0].aval) * contracted
    if eqn.primitive.name.startswith("ragged_dot"):
        lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        return 2.0 * lhs[0] * lhs[-1] * rhs[-1]
    if eqn.primitive.name == "conv_general_dilated":
        return conv_flops(eqn)
    return 2.0 * sum(aval_size(v.aval) for v in eqn.outvars)  # a lower bound for anything else


def mxu_passes(eqn: Any, cast_up: set[Any] = frozenset()) -> int:
    """bf16 MXU passes a dot_general takes on a TPU: 6 at HIGHEST precision (or an f32 dot
    algorithm), 3 at HIGH, 1 otherwise; 1 whatever its precision when no operand is a float32
    value beyond bf16 (bf16 operands, or bf16 values cast up, which XLA multiplies in one pass:
    measured on a v5e, docs/performance-model.md)."""
    if not any(str(getattr(v.aval, "dtype", "")) == "float32" and v not in cast_up for v in eqn.invars[:2]):
        return 1
    precision = eqn.params.get("precision")
    names = [str(p) for p in (precision if isinstance(precision, tuple) else (precision,)) if p is not None]
    if any("HIGHEST" in n or "X6" in n or "F32_F32_F32" in n for n in names):
        return 6
    if any(n.endswith("HIGH") or "X3" in n for n in names):
        return 3
    return 1


def _narrow(var: Any) -> bool:
    """A value whose every number a bf16 holds exactly: bf16, an 8-bit float, an integer of
    8 bits or fewer, a bool (not float16: its 10-bit mantissa is wider than bf16's)."""
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    name = str(dtype)
    return name in ("bfloat16", "bool") or name.startswith("float8") or (
        name.startswith(("int", "uint")) and dtype.itemsize == 1)


def conv_flops(eqn: Any) -> float:
    """2 * output size * (kernel window x input features per group): each output element is
    a dot product over the kernel's window and its group's input features, i.e. over every
    rhs element but the output-feature axis. (Taps that fall on padding count too, as in
    XLA's cost analysis.)"""
    rhs_shape = eqn.invars[1].aval.shape
    rhs_spec = eqn.params["dimension_numbers"].rhs_spec  # (out features, in features, *window)
    per_output = math.prod(rhs_shape) // max(int(rhs_shape[rhs_spec[0]]), 1)
    return 2.0 * aval_size(eqn.outvars[0].aval) * per_output


MXU_TILE = 128  # the MXU multiplies operands in 128-wide tiles of lanes (every TPU generation's layout)


def conv_mxu_flops(eqn: Any) -> float:
    """A convolution's FLOPs as the MXU runs them: each group a matmul whose contraction (the
    window's taps times the group's input features, which XLA folds together when the features
    are few) and whose output features are padded up to whole MXU tiles. A 3-channel 3x3 conv
    contracts 27 values in a 128-wide tile; 16 output features fill an eighth of one. Groups run
    one at a time, or packed block-diagonally as many as fill a 128-wide output tile, whichever
    pads less: a depthwise conv's 128 channels share one tile, not a tile each. Taps on the zeros
    of an lhs dilation are not run (conv_dilation_share)."""
    rhs_shape = eqn.invars[1].aval.shape
    out_dim = eqn.params["dimension_numbers"].rhs_spec[0]
    groups = max(int(eqn.params.get("feature_group_count", 1)), int(eqn.params.get("batch_group_count", 1)))
    out_features = max(int(rhs_shape[out_dim]) // groups, 1)
    contraction = max(math.prod(rhs_shape) // max(int(rhs_shape[out_dim]), 1), 1)

    def padding(packed: int) -> float:  # MXU work over the nominal, `packed` groups to a matmul
        tiles = -(-groups // packed)
        return (tiles * _padded(contraction * packed) * _padded(out_features * packed)
                / (groups * contraction * out_features))

    packed = min(groups, max(MXU_TILE // out_features, 1))
    return conv_flops(eqn) * conv_dilation_share(eqn) * min(padding(1), padding(packed))


def dot_tile_padding(eqn: Any) -> float:
    """The MXU's work on a dot_general over its FLOPs: the MXU holds the rhs in MXU_TILE-square
    tiles, so the contraction and the rhs's lane dim (its last free dim) run padded up to whole
    tiles. A 64-wide attention head contracts q.k^T over half a tile and fills half of p.v's
    output: 2x each, where a 128-wide head is 1x. The lhs's rows stream through and are not padded."""
    (lhs_contract, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
    lhs_shape, rhs_shape = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    contraction = math.prod(int(lhs_shape[d]) for d in lhs_contract)
    free = [int(rhs_shape[d]) for d in range(len(rhs_shape)) if d not in (*rhs_contract, *rhs_batch)]
    lanes = free[-1] if free else 1
    if not contraction or not lanes:
        return 1.0
    return _padded(contraction) * _padded(lanes) / (contraction * lanes)


def conv_dilation_share(eqn: Any) -> float:
    """The share of a convolution's taps that fall on its input's values, not on the zeros an
    lhs dilation (a transposed convolution's stride) puts between them: 1/4 for a 2-D stride of 2."""
    return 1.0 / math.prod(int(d) for d in (eqn.params.get("lhs_dilation") or (1,)))


def _padded(n: int) -> int:
    return -(-n // MXU_TILE) * MXU_TILE


def trip_count(eqn: Any, trips: Mapping[int, int | None] | None = None) -> tuple[float, bool]:
    """(times the sub-jaxprs of eqn run, whether that is known). A scan runs `length` times;
    a while loop its maximum trip count from `trips` (evaluator/analysis/intervals.py), else once,
    unknown; anything else (cond, calls) once."""
    if eqn.primitive.name == "scan":
        return float(eqn.params.get("length", 1)), True
    if eqn.primitive.name == "while":
        n = (trips or {}).get(id(eqn))
        return (1.0, False) if n is None else (float(n), True)
    return 1.0, True


def loop_trips(jaxpr: Any, trips: Mapping[int, int | None] | None = None) -> list[int]:
    """Trip counts of the loops of a kernel body (scans, while loops: `fori_loop` is one or the
    other), nested ones included, in the order they appear, depth first; -1 where unknown. The
    coverage stage matches a kernel's loops across sizes by this order."""
    out: list[int] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("scan", "while"):
            n, known = trip_count(eqn, trips)
            out.append(int(n) if known else -1)
        for sub in sub_jaxprs(eqn):
            out += loop_trips(sub, trips)
    return out


@dataclass
class _Reach:
    """Inside a kernel body: the conds decided by the grid position, and the share of grid
    steps and loop iterations that reach the part of the body being walked (1.0 outside
    any decided branch)."""

    conds: GridConds
    share: float = 1.0


def _walk(jaxpr: Any, mult: float, cost: Cost, count_heavy: bool,
          trips: Mapping[int, int | None] | None, on_pallas_call: PallasCallSink | None,
          reach: _Reach | None = None) -> None:
    cast_up: set[Any] = set()  # this jaxpr's f32 values that are narrow values converted
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "convert_element_type" and _narrow(eqn.invars[0]):
            cast_up.update(eqn.outvars)
        if name == "pallas_call":
            if on_pallas_call is not None:
                on_pallas_call(eqn, mult)
            continue
        if name in CALLBACK_PRIMITIVES:
            cost.callbacks.append(name)
            continue
        if name in MEMORY_ACCESS_PRIMITIVES:
            cost.accesses += mult
        if name == "dma_start":
            cost.dma_bytes += mult * dma_dst_bytes(eqn)
            continue
        sub = list(sub_jaxprs(eqn))
        if sub:
            count, known = trip_count(eqn, trips)
            cost.data_dependent_trips |= not known
            inner_mult = mult * count
            if name in ("scan", "while"):
                cost.loop_iterations += inner_mult
            if name == "cond" and reach is not None and id(eqn) in reach.conds.share:
                # Decided by the grid position (and loop counters): each branch by the share
                # of grid points and loop iterations that run it, which already holds the
                # enclosing decided branches' shares (divided out of `mult`: `reach.share`).
                loops = inner_mult / reach.share
                for k, j in enumerate(sub):
                    share = float(reach.conds.share[id(eqn)][k])
                    if share > 0:
                        _walk(j, loops * share, cost, count_heavy, trips, on_pallas_call,
                              _Reach(reach.conds, share))
            elif name == "cond":  # one branch runs: charge the dearest
                branch_costs = []
                for j in sub:
                    c = Cost()
                    _walk(j, inner_mult, c, count_heavy, trips, on_pallas_call, reach)
                    branch_costs.append(c)
                _merge_dearest(cost, branch_costs)
            else:
                for j in sub:
                    _walk(j, inner_mult, cost, count_heavy, trips, on_pallas_call, reach)
            continue
        if not is_free(eqn):
            nbytes = sum(aval_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval"))
            cost.bytes_accessed += mult * nbytes
        if name in HEAVY_PRIMITIVES:
            if name == "dot_general":
                passes = mxu_passes(eqn, cast_up)
                cost.multipass_flops += mult * dot_flops(eqn) * (passes - 1)
                cost.mxu_padding_flops += mult * dot_flops(eqn) * passes * (dot_tile_padding(eqn) - 1)
            if name == "conv_general_dilated":
                cost.conv_flops += mult * conv_flops(eqn)
                cost.conv_skipped_flops += mult * conv_flops(eqn) * (1 - conv_dilation_share(eqn))
                cost.conv_mxu_flops += mult * conv_mxu_flops(eqn)
            if count_heavy:
                flops = mult * dot_flops(eqn)
                cost.flops += flops
                cost.matmul_flops += flops
                if any(str(getattr(v.aval, "dtype", "")) == "float32" for v in eqn.invars[:2]):
                    cost.f32_matmul_flops += flops
            else:
                cost.heavy_ops.append(name)
                cost.heavy_flops += mult * dot_flops(eqn)
            continue
        if name in DATA_MOVEMENT_PRIMITIVES:
            continue
        if name in REDUCTION_PRIMITIVES:
            flops = sum(aval_size(v.aval) for v in eqn.invars if hasattr(v, "aval"))
        else:
            flops = sum(aval_size(v.aval) for v in eqn.outvars)
        cost.flops += mult * flops
        cost.top_ops[name] = cost.top_ops.get(name, 0.0) + mult * flops
        if name in TRANSCENDENTAL_PRIMITIVES:
            cost.transcendentals += mult * flops


def _merge_dearest(into: Cost, branches: list[Cost]) -> None:
    """A cond: the branch with the most FLOPs counts (its bytes and ops with it), the most
    DMA bytes of any branch count, and a heavy op, callback or unknown loop in any branch."""
    worst = max(branches, key=lambda c: c.flops)
    into.flops += worst.flops
    into.matmul_flops += worst.matmul_flops
    into.f32_matmul_flops += worst.f32_matmul_flops
    into.transcendentals += worst.transcendentals
    into.bytes_accessed += worst.bytes_accessed
    into.heavy_flops += worst.heavy_flops
    into.conv_flops += worst.conv_flops
    into.conv_skipped_flops += worst.conv_skipped_flops
    into.conv_mxu_flops += worst.conv_mxu_flops
    into.multipass_flops += worst.multipass_flops
    into.mxu_padding_flops += worst.mxu_padding_flops
    into.loop_iterations += worst.loop_iterations
    into.dma_bytes += max(c.dma_bytes for c in branches)
    into.accesses += max(c.accesses for c in branches)
    for op, f in worst.top_ops.items():
        into.top_ops[op] = into.top_ops.get(op, 0.0) + f
    for c in branches:
        into.heavy_ops.extend(c.heavy_ops)
        into.callbacks.extend(c.callbacks)
        into.data_dependent_trips |= c.data_dependent_trips


def is_free(eqn: Any) -> bool:
    """Ops XLA turns into nothing: reshapes, and pads/slices/casts that change nothing."""
    if eqn.primitive.name in ("reshape", "squeeze", "expand_dims"):
        return True
    ins = [v.aval for v in eqn.invars if hasattr(v, "aval")]
    outs = [v.aval for v in eqn.outvars]
    return (eqn.primitive.name in DATA_MOVEMENT_PRIMITIVES and len(outs) == 1 and bool(ins)
            and getattr(ins[0], "shape", None) == outs[0].shape and ins[0].dtype == outs[0].dtype)


def dma_dst_bytes(eqn: Any) -> float:
    """Bytes a dma_start writes: its destination as indexed (`buf.at[slot, rows]`, from the
    eqn's `tree` of (src, dst, semaphores...)), else the whole destination buffer."""
    try:
        dst = eqn.params["tree"].unflatten([getattr(v, "aval", None) for v in eqn.invars])[1]
        return float(math.prod(dst.shape) * np.dtype(dst.dtype).itemsize)
    except Exception:  # noqa: BLE001  (another jax's layout of the operands)
        refs = [v.aval for v in eqn.invars  # refs (not index scalars), semaphores excluded
                if hasattr(getattr(v, "aval", None), "inner_aval")
                and "sem" not in str(v.aval.memory_space).lower()]
        if len(refs) < 2:
            return 0.0
        return float(math.prod(refs[1].shape) * np.dtype(refs[1].dtype).itemsize)


def aval_size(aval: Any) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def aval_nbytes(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 4
    return aval_size(aval) * itemsize
