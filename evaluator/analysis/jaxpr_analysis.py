"""Read a traced program: where its pallas_calls are and what runs outside them.

Runs in the worker on the candidate's jaxpr and in the host on the reference's jaxpr; it
returns plain dataclasses so the verdict logic never touches jax objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from evaluator.analysis import intervals, traffic as traffic_analysis, trip_origin
from evaluator.analysis.glue_fusion import fused_glue_bytes
from evaluator.analysis.grid_checks import GridFinding, argument_regions, check_grid
from evaluator.analysis.grid_conds import branches_taken
from evaluator.analysis.intermediates import Intermediate, OutsideMath, analyze as analyze_intermediates
from evaluator.analysis.jaxpr_cost import Cost, loop_trips, walk
from evaluator.analysis.jaxpr_walk import sub_jaxprs
from evaluator.analysis.kernel_dataflow import RefUse, dma_uses, ref_uses
from evaluator.analysis.parameter_work import without_parameter_work
from evaluator.analysis.precision import low_precision_dots


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
    # Per grid step, the mean over the grid: a pl.when decided by the grid position counts
    # on the steps that take it (evaluator/analysis/grid_conds.py). Traffic analysis only.
    flops_per_step: float = 0.0
    f32_matmul_flops_per_step: float = 0.0  # of flops_per_step: matmuls on float32 operands
    multipass_flops_per_step: float = 0.0   # beyond flops_per_step: dots' extra MXU passes (jaxpr_cost.Cost)
    mxu_padding_flops_per_step: float = 0.0  # and beyond those: dots' operands padded to MXU tiles
    vector_flops_per_step: float = 0.0  # of flops_per_step: all but matmuls (the vector units' work)
    dma_bytes_per_step: float = 0.0   # traffic analysis only
    # Memory accesses of the body per grid step, every loop iteration counted: what a run in
    # interpret mode costs (evaluator/execution/step_limits.py); at every size.
    accesses_per_step: float = 0.0
    # Trip counts of the body's loops (scans and while loops, nested ones included) in the
    # order they appear, -1 where unknown: the in-kernel iteration the coverage stage runs at
    # least three times where bench sizes do (evaluator/analysis/coverage.py); at every size.
    loop_trips: list[int] = field(default_factory=list)
    # For each cond of the body in order, the branches it takes at some grid step, None where
    # the grid position does not decide it (grid_conds.branches_taken). Traffic analysis only.
    branches: list[list[int] | None] = field(default_factory=list)
    # A while loop in the body has no known maximum trip count and was counted once, so
    # flops_per_step and dma_bytes_per_step are lower bounds (traffic analysis only).
    data_dependent_trips: bool = False
    # What those unknown trip counts depend on when it is not only the task's bounded integer
    # inputs ("float data", evaluator/analysis/trip_origin.py); '' otherwise. Only counts from those
    # inputs leave the work rules undecided (`undecided_trips`).
    unbounded_trips_from: str = ""
    runs: float = 1.0  # times the call runs: trip counts of the loops around it, outside kernels
    # What the body does with its scratch buffers and prefetched scalars (kernel_dataflow.py),
    # aligned with `scratch` and with the prefetched operands; and which blocks' index maps
    # read prefetched scalars (by index into `blocks`). The evidence of the features stage.
    scratch_use: list[RefUse] = field(default_factory=list)
    prefetch_use: list[RefUse] = field(default_factory=list)
    # What the body does with each distinct ref its DMAs copy into (an output ref reaches the
    # output by itself): the evidence of the `manual_dma` requirement.
    dma_use: list[RefUse] = field(default_factory=list)
    prefetch_index_maps: list[int] = field(default_factory=list)
    # pallas_call's input_output_aliases as (index into `blocks` of the input, output index): the
    # outputs written in place over an input buffer (the `input_output_aliases` requirement).
    aliases: list[tuple[int, int]] = field(default_factory=list)
    # The index maps evaluated over the whole static grid (evaluator/analysis/grid_checks.py): blocks
    # out of range, output blocks never written, inputs not read in full; and what was not
    # checked, and why. Judged at bench sizes by the index-maps stage.
    grid_findings: list[GridFinding] = field(default_factory=list)
    grid_unchecked: list[str] = field(default_factory=list)
    # dot_generals of the body on int8/fp8 operands ("int8 x int8 -> int32"): below a float
    # task's precision (evaluator/analysis/precision.py).
    low_precision_dots: list[str] = field(default_factory=list)
    # What tells one kernel from another across sizes (evaluator/analysis/one_program.py,
    # coverage.py): the body function's name, or where a pallas_call `name`, which may carry the
    # shapes (ejkernel's "gmm_v3-g_8-m_8192-k_2048-..."), replaced it, where the body is defined.
    body: str = ""

    @property
    def key(self) -> str:
        return self.body or self.name

    @property
    def races_possible(self) -> bool:
        """Whether interpret mode's race detector can find anything in this kernel: with one
        core, only the body's own DMAs run beside it (evaluator/execution/handlers.py, run)."""
        return bool(RACE_PRIMITIVES & set(self.kernel_primitives))

    @property
    def grid_steps(self) -> int:
        return math.prod(max(g, 1) for g in self.grid) if self.grid else 1

    @property
    def undecided_trips(self) -> bool:
        """Its FLOPs are a lower bound the work rules may not judge: a loop or grid counted
        once whose length comes from the task's bounded integer inputs alone."""
        return self.data_dependent_trips and not self.unbounded_trips_from

    @property
    def vector_flops(self) -> float:
        return self.vector_flops_per_step * self.grid_steps * self.runs

    @property
    def flops(self) -> float:
        """FLOPs of every run of the kernel (traffic analysis only, else 0)."""
        return self.flops_per_step * self.grid_steps * self.runs

    @property
    def f32_matmul_flops(self) -> float:
        """Of `flops`: matmul FLOPs on float32 operands (slower on the MXU than bf16)."""
        return self.f32_matmul_flops_per_step * self.grid_steps * self.runs

    @property
    def multipass_flops(self) -> float:
        """Beyond `flops`: the extra MXU passes of dots at HIGH or HIGHEST precision."""
        return self.multipass_flops_per_step * self.grid_steps * self.runs

    @property
    def mxu_padding_flops(self) -> float:
        """Beyond `flops` and `multipass_flops`: dots' operands padded to whole MXU tiles."""
        return self.mxu_padding_flops_per_step * self.grid_steps * self.runs


# Kernel primitives that act beside the core (a DMA in flight) or order such actions: what a
# race needs with one core.
RACE_PRIMITIVES = frozenset({"dma_start", "dma_wait", "semaphore_signal", "semaphore_wait"})


@dataclass
class TraceSummary:
    pallas_calls: list[PallasCallInfo]
    outside: Cost  # everything outside pallas_calls
    out_shapes: list[tuple[list[int], str]]
    # Data passed kernel -> HBM -> kernel, and exp/log/reductions outside kernels, largest
    # first (evaluator/analysis/intermediates.py): the structure stage weighs them against the case.
    intermediates: list[Intermediate] = field(default_factory=list)
    outside_math: list[OutsideMath] = field(default_factory=list)
    parameter_eqns: int = 0  # equations on parameters alone, left out of `outside`
    # The glue's bytes once XLA has fused it (evaluator/analysis/glue_fusion.py): what the speed
    # prediction prices where it is less than `outside`'s op-by-op count.
    glue_fused_bytes: float = 0.0

    @property
    def races_possible(self) -> bool:
        """Whether the race detector must run for this program: it is on for a whole run when
        any of its kernels starts DMAs of its own."""
        return any(call.races_possible for call in self.pallas_calls)

    @property
    def kernel_flops(self) -> float:
        """FLOPs inside all kernels (flops per grid step x grid steps x runs, summed), to set
        against the reference's; 0 unless summarize ran with traffic=True."""
        return sum(call.flops for call in self.pallas_calls)


def summarize(closed_jaxpr: Any, traffic: bool = False,
              arg_bounds: Sequence[Sequence[int] | None] | None = None,
              first_parameter: int | None = None) -> TraceSummary:
    """Summarise a ClosedJaxpr from `jax.make_jaxpr`; `traffic` adds what each kernel moves
    and computes (evaluator/analysis/traffic.py), for the performance model at bench sizes.

    `arg_bounds`, aligned with the jaxpr's invars (kernel()'s arguments), gives inclusive
    (lo, hi) bounds of integer inputs or None (`Task.arg_bounds(case)`). They reach each
    kernel's scalar-prefetch operands, so that loops whose trip count depends on that data
    count at their maximum (evaluator/analysis/intervals.py); without them such loops count once.

    `first_parameter`: kernel()'s arguments from this index on are the task's parameters;
    work on them alone (weight folding) is left out of `outside` (evaluator/analysis/parameter_work.py)."""
    bounds = intervals.analyze_program(closed_jaxpr, arg_bounds)
    calls: list[tuple[Any, float]] = []
    outside_jaxpr, folded = without_parameter_work(closed_jaxpr.jaxpr, first_parameter)
    cost = walk(outside_jaxpr, bounds.loop_trips, count_heavy=False,
                on_pallas_call=lambda eqn, runs: calls.append((eqn, runs)))
    outs = [(list(v.aval.shape), str(v.aval.dtype)) for v in closed_jaxpr.jaxpr.outvars]
    infos = [_pallas_info(e, traffic, runs, bounds.pallas_operands.get(id(e))) for e, runs in calls]
    if traffic and any(info.data_dependent_trips for info in infos):
        _unbounded_trip_origins(closed_jaxpr, arg_bounds, bounds, calls, infos)
    arguments = argument_regions(closed_jaxpr)
    for (eqn, _), info in zip(calls, infos):
        info.grid_findings, info.grid_unchecked = check_grid(eqn, arguments)
    flow = analyze_intermediates(closed_jaxpr.jaxpr, bounds.loop_trips, _kernel_name)
    return TraceSummary(infos, cost, outs, flow.intermediates, flow.outside_math, folded,
                        fused_glue_bytes(outside_jaxpr))


def _pallas_info(eqn: Any, traffic: bool = False, runs: float = 1.0,
                 operand_bounds: list[intervals.Interval] | None = None) -> PallasCallInfo:
    gm = eqn.params["grid_mapping"]
    grid = tuple(int(g) if isinstance(g, (int, np.integer)) else -1 for g in gm.grid)
    static_grid = all(g >= 0 for g in grid)
    # A grid dimension given by a traced value (megablox gmm's active tiles) counts at the
    # bound of that operand, or of the prefetched table its index reads, where one is known;
    # else it stays -1 (one step, a lower bound).
    grid, unbounded_grid = _bounded_grid(grid, operand_bounds, _prefetch_lengths(gm, len(grid)))
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
    trips = intervals.kernel_loop_trips(eqn, operand_bounds)
    step, conds = traffic_analysis.kernel_cost_per_step(kernel_jaxpr, trips, grid if traffic and static_grid else None)
    accesses = step.accesses
    if not traffic:  # FLOPs and DMA bytes are the traffic analysis' (see the fields)
        step = Cost()
    scratch_use, prefetch_use, dma_use = _ref_evidence(gm, kernel_jaxpr)
    return PallasCallInfo(
        name=_kernel_name(eqn),
        body=_kernel_body(eqn),
        grid=list(grid),
        blocks=blocks,
        scratch=scratch,
        num_scalar_prefetch=int(gm.num_index_operands),
        dimension_semantics=[_semantics_name(s) for s in semantics] if semantics else None,
        vmem_limit_bytes=getattr(params, "vmem_limit_bytes", None),
        kernel_primitives=sorted(_all_primitives(kernel_jaxpr)),
        low_precision_dots=low_precision_dots(kernel_jaxpr),
        flops_per_step=step.flops,
        f32_matmul_flops_per_step=step.f32_matmul_flops,
        multipass_flops_per_step=step.multipass_flops,
        mxu_padding_flops_per_step=step.mxu_padding_flops,
        vector_flops_per_step=step.flops - step.matmul_flops,
        dma_bytes_per_step=step.dma_bytes,
        accesses_per_step=accesses,
        loop_trips=loop_trips(kernel_jaxpr, trips),
        branches=branches_taken(kernel_jaxpr, conds) if conds is not None else [],
        data_dependent_trips=step.data_dependent_trips or unbounded_grid,
        runs=runs,
        scratch_use=scratch_use,
        prefetch_use=prefetch_use,
        dma_use=dma_use,
        prefetch_index_maps=[i for i, bm in enumerate(gm.block_mappings)
                             if traffic_analysis.reads_prefetched(bm, len(grid))],
        aliases=[(int(i) - int(gm.num_index_operands), int(o))
                 for i, o in eqn.params.get("input_output_aliases", ())],
    )


def _ref_evidence(gm: Any, kernel_jaxpr: Any) -> tuple[list[RefUse], list[RefUse], list[RefUse]]:
    """Uses of the scratch refs, of the prefetched-scalar refs and of the refs DMAs copy into,
    of a kernel body whose inputs are, in order: prefetched scalars, inputs, outputs, scratch."""
    invars = kernel_jaxpr.invars
    n_pre, n_in, n_out = int(gm.num_index_operands), int(gm.num_inputs), int(gm.num_outputs)
    outputs = invars[n_pre + n_in:n_pre + n_in + n_out]
    scratch = invars[n_pre + n_in + n_out:]
    uses = ref_uses(kernel_jaxpr, [*scratch, *invars[:n_pre]], outputs)
    return uses[:len(scratch)], uses[len(scratch):], dma_uses(kernel_jaxpr, outputs)


def _unbounded_trip_origins(closed_jaxpr: Any, arg_bounds: Any, bounds: intervals.ProgramBounds,
                            calls: list[tuple[Any, float]], infos: list[PallasCallInfo]) -> None:
    """Set `unbounded_trips_from` of the calls whose trip counts are unknown."""
    try:
        origins = trip_origin.program_origins(closed_jaxpr, arg_bounds)
    except Exception:  # noqa: BLE001  (an odd program must not fail a grading)
        origins = {}
    for (eqn, _), info in zip(calls, infos):
        if not info.data_dependent_trips:
            continue
        try:
            trips = intervals.kernel_loop_trips(eqn, bounds.pallas_operands.get(id(eqn)))
            origin = trip_origin.unbounded_trips_origin(eqn, origins.get(id(eqn)), trips, info.grid)
        except Exception:  # noqa: BLE001  (unknown origin: the work rules stay on)
            origin = trip_origin.OTHER
        info.unbounded_trips_from = trip_origin.describe(origin)


def _bounded_grid(grid: tuple[int, ...], operand_bounds: list[intervals.Interval] | None,
                  indexed: dict[int, int] | None = None) -> tuple[tuple[int, ...], bool]:
    """Dynamic grid dimensions (-1) replaced by their operands' upper bounds (the leading
    pallas_call operands, one per dynamic dimension, in order), or by the length of a
    prefetched array that dimension's index reads (`indexed`) where that is lower; True when
    a dimension has neither."""
    bounds = iter(operand_bounds or ())
    out, unbounded = [], False
    for dim, g in enumerate(grid):
        if g >= 0:
            out.append(g)
            continue
        hi = getattr(next(bounds, None), "hi", None)
        hi = min(hi if hi is not None and math.isfinite(hi) else math.inf, (indexed or {}).get(dim, math.inf))
        if not math.isfinite(hi):
            out.append(-1)
            unbounded = True
        else:
            out.append(max(int(hi), 1))
    return tuple(out), unbounded


def _prefetch_lengths(gm: Any, n_grid: int) -> dict[int, int]:
    """grid dimension -> the shortest 1-D prefetched array that a block's index map reads at
    that dimension's index itself. Past that length the read is out of bounds, so a dynamic
    dimension runs at most that many steps: megablox gmm sizes its grid by the active m tiles
    (an interval bound of 4104 at 8192 rows in 8 groups, since intervals cannot see that the
    group sizes sum to the rows) and reads its tile tables, 71 long, at that index."""
    found: dict[int, int] = {}
    for bm in gm.block_mappings:
        jaxpr = bm.index_map_jaxpr.jaxpr
        grid_vars, prefetch = jaxpr.invars[:n_grid], {id(v) for v in jaxpr.invars[n_grid:]}
        for eqn in jaxpr.eqns:
            ref = eqn.invars[0] if eqn.invars else None
            shape = getattr(getattr(ref, "aval", None), "shape", ())
            if eqn.primitive.name != "get" or id(ref) not in prefetch or len(shape) != 1:
                continue
            for dim, v in enumerate(grid_vars):
                if any(u is v for u in eqn.invars[1:]):
                    found[dim] = min(found.get(dim, int(shape[0])), int(shape[0]))
    return found


def _kernel_name(eqn: Any) -> str:
    """The kernel body's function name ("matmul_kernel"), for feedback."""
    if eqn.params.get("name"):
        return str(eqn.params["name"])
    return _body_source(eqn).split(" at ")[0] or "kernel"


def _kernel_body(eqn: Any) -> str:
    """The kernel's identity across sizes: its body function's name, or where a pallas_call
    `name` replaced that (jax's debug info then reads "<name> at file:line"), where the body is
    defined; '' where jax kept neither."""
    src = _body_source(eqn)
    if not eqn.params.get("name"):
        return src.split(" at ")[0]
    return src.rpartition(" at ")[2] if " at " in src else ""


def _body_source(eqn: Any) -> str:
    """jax's "<function name> at <file>:<line>" for the kernel body, '' where it kept none."""
    info = getattr(eqn.params["jaxpr"], "debug_info", None)
    return getattr(info, "func_src_info", None) or ""


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
