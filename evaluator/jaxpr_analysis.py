"""Read a traced program: where its pallas_calls are and what runs outside them.

Runs in the worker on the candidate's jaxpr and in the host on the reference's jaxpr; it
returns plain dataclasses so the verdict logic never touches jax objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

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
    dma_bytes_per_step: float = 0.0   # traffic analysis only


@dataclass
class OutsideCost:
    """Estimated cost of everything outside pallas_calls."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    heavy_ops: list[str] = field(default_factory=list)
    callbacks: list[str] = field(default_factory=list)
    top_ops: dict[str, float] = field(default_factory=dict)  # primitive -> flops, for feedback


@dataclass
class TraceSummary:
    pallas_calls: list[PallasCallInfo]
    outside: OutsideCost
    out_shapes: list[tuple[list[int], str]]


def summarize(closed_jaxpr: Any, traffic: bool = False) -> TraceSummary:
    """Summarise a ClosedJaxpr from `jax.make_jaxpr`; `traffic` adds what each kernel moves
    and computes (evaluator/traffic.py), for the performance model at bench sizes."""
    eqns: list[Any] = []
    cost = OutsideCost()
    _walk(closed_jaxpr.jaxpr, 1.0, eqns, cost)
    outs = [(list(v.aval.shape), str(v.aval.dtype)) for v in closed_jaxpr.jaxpr.outvars]
    return TraceSummary([_pallas_info(e, traffic) for e in eqns], cost, outs)


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
    # Convolutions and the rest: a lower bound is enough, they are refused anyway.
    return 2.0 * sum(_size(v.aval) for v in eqn.outvars)


def total_flops(closed_jaxpr: Any) -> float:
    """FLOPs of a whole program with no kernels (the reference), matmuls included."""
    cost = OutsideCost()
    _walk(closed_jaxpr.jaxpr, 1.0, [], cost, count_heavy=True)
    return cost.flops


def _walk(jaxpr: Any, mult: float, calls: list[Any], cost: OutsideCost,
          count_heavy: bool = False) -> None:
    """Cost everything outside pallas_calls into `cost`; collect the pallas_call eqns."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            calls.append(eqn)
            continue
        if name in CALLBACK_PRIMITIVES:
            cost.callbacks.append(name)
            continue
        sub = list(_sub_jaxprs(eqn))
        if sub:
            inner_mult = mult * _trip_count(eqn)
            if name == "cond":  # one branch runs: charge the dearest
                branch_costs = []
                for j in sub:
                    c = OutsideCost()
                    _walk(j, inner_mult, calls, c, count_heavy)
                    branch_costs.append(c)
                worst = max(branch_costs, key=lambda c: c.flops)
                _merge(cost, worst, branch_costs)
            else:
                for j in sub:
                    _walk(j, inner_mult, calls, cost, count_heavy)
            continue
        if not _is_free(eqn):
            nbytes = sum(_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval"))
            cost.bytes_accessed += mult * nbytes
        if name in HEAVY_PRIMITIVES:
            if count_heavy:
                cost.flops += mult * dot_flops(eqn)
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
    into.transcendentals += worst.transcendentals
    into.bytes_accessed += worst.bytes_accessed
    for op, f in worst.top_ops.items():
        into.top_ops[op] = into.top_ops.get(op, 0.0) + f
    for c in all_costs:  # a heavy op or callback in any branch counts
        into.heavy_ops.extend(c.heavy_ops)
        into.callbacks.extend(c.callbacks)


def _trip_count(eqn: Any) -> float:
    if eqn.primitive.name == "scan":
        return float(eqn.params.get("length", 1))
    return 1.0  # while loops: unknown trips, charged once


def _sub_jaxprs(eqn: Any) -> Iterator[Any]:
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "jaxpr") and hasattr(item, "consts"):  # ClosedJaxpr
                yield item.jaxpr
            elif hasattr(item, "eqns") and hasattr(item, "invars"):  # Jaxpr
                yield item


def _pallas_info(eqn: Any, traffic: bool = False) -> PallasCallInfo:
    from evaluator import traffic as traffic_analysis

    gm = eqn.params["grid_mapping"]
    grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1 for g in gm.grid)
    static_grid = all(g >= 0 for g in grid)
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
    flops, dma = traffic_analysis.kernel_cost_per_step(kernel_jaxpr) if traffic else (0.0, 0.0)
    return PallasCallInfo(
        name=_kernel_name(eqn),
        grid=list(grid),
        blocks=blocks,
        scratch=scratch,
        num_scalar_prefetch=int(gm.num_index_operands),
        dimension_semantics=[_semantics_name(s) for s in semantics] if semantics else None,
        vmem_limit_bytes=getattr(params, "vmem_limit_bytes", None),
        kernel_primitives=sorted(_all_primitives(kernel_jaxpr)),
        flops_per_step=flops,
        dma_bytes_per_step=dma,
    )


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
        for sub in _sub_jaxprs(eqn):
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
