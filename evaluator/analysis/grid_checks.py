"""Static checks of a pallas_call's grid: index maps evaluated at every grid point.

Bench sizes are traced and lowered but never run on a CPU, and check sizes are small: a
kernel whose check cases fit in one block along an axis never shows an index map that is
wrong only when that axis has several blocks (a transposed output map, an axis pinned to
block 0). So the worker evaluates every block mapping's index map over the whole static grid
(vectorised, like evaluator/analysis/traffic.py) and records what a TPU run would get wrong:

- `out_of_range`: a block that starts past the end of its array (a ragged last block, which
  starts inside the array, is fine; interpret mode pads to whole blocks the same way). On a
  TPU that is an out-of-bounds DMA; TPU interpret mode raises IndexError for it.
- `unwritten`: an output block that no grid step writes; it holds whatever HBM held.
- `unread`: an argument of kernel() passed to the pallas_call as it is, cast, or
  zero-padded at the end (also through jit and custom_vjp), whose blocks miss part of the
  argument's own elements along some axis: the reference reads all of it (an index map that
  ignores a grid index, such as the K index of a matmul). Other arrays the wrapper builds are
  not checked: honest kernels over-allocate them (jax's flash attention backward broadcasts
  its row statistics to 256 lanes and reads 128).

Not checked, and listed in `PallasCallInfo.grid_unchecked`: grids with a dynamic dimension or
more than MAX_GRID_POINTS points; index maps that read scalar-prefetch values (the block is
data-dependent: paged attention, megablox); operands outside the pipeline (`pl.ANY`, moved by
manual DMA) or with `pl.Element`/`pl.BoundedSlice` dims; outputs aliased to an input (an
in-place update leaves blocks as they were) or dropped by the program. Several operands of
one pallas_call that are the same array (a halo block read beside the main one) count
together for `unread`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from evaluator.analysis.traffic import block_indices, reads_prefetched

# Grids up to this many points are evaluated whole (about 0.5 s per block mapping at the
# cap); larger ones are skipped and listed as unchecked.
MAX_GRID_POINTS = 1 << 20

# Equations that pass their operands unchanged into a sub-jaxpr (so a kernel() argument keeps
# its identity inside) or change only the dtype (a cast keeps every element).
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
                    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
_CASTS = frozenset({"convert_element_type", "copy", "copy_p"})


@dataclass
class GridFinding:
    """One fault of a block mapping over the grid, for the index-maps stage's message."""

    kind: str  # "out_of_range", "unwritten" or "unread"
    operand: str  # "input 0", "output 1": the position in in_specs / out_specs
    array_shape: list[int]
    block_shape: list[int | None]  # None: a squeezed dim (the index is an element index)
    dtype: str
    block_index: list[int]  # out_of_range: the index returned; else a block never visited
    axis: int  # the array axis at fault
    grid_point: list[int] = field(default_factory=list)  # out_of_range: the first such step

    def describe_block(self) -> str:
        blocks = tuple("squeezed" if b is None else b for b in self.block_shape)
        return f"{self.dtype}{list(self.array_shape)} array in blocks of {blocks}"


@dataclass
class _Mapping:
    """A block mapping that can be checked: its evaluated indices and block geometry."""

    position: int  # index into the block mappings (inputs then outputs)
    operand: str
    dims: list[int]
    sizes: list[int | None]  # block size per dim, None for squeezed
    dtype: str
    indices: np.ndarray  # [dims, grid points], iteration order

    @property
    def n_blocks(self) -> list[int]:
        return [d if s is None else -(-d // s) for d, s in zip(self.dims, self.sizes)]


def argument_regions(closed_jaxpr: Any) -> dict[int, tuple[int, ...]]:
    """ids of the variables (at any depth of call nesting) that hold a kernel() argument
    unchanged, cast, or zero-padded at the end, each with the extent of the argument's own
    elements in it (from index 0 on every axis): what the reference reads in full. A jaxpr
    shared by several calls (jit reuses it) counts only if every call passes arguments."""
    held: dict[int, tuple[int, ...]] = {}
    not_held: set[int] = set()

    def mark(var: Any, region: tuple[int, ...] | None) -> None:
        if region is None:
            not_held.add(id(var))
        else:
            held.setdefault(id(var), region)

    def visit(jaxpr: Any, regions: list[tuple[int, ...] | None]) -> None:
        for var, region in zip(jaxpr.invars, regions):
            mark(var, region)
        for eqn in jaxpr.eqns:
            ins = [held.get(id(v)) if id(v) not in not_held else None for v in eqn.invars]
            name = eqn.primitive.name
            outs: list[tuple[int, ...] | None] = [None] * len(eqn.outvars)
            if name in _CASTS and ins and ins[0] is not None:
                outs[0] = ins[0]
            elif name == "pad" and ins and ins[0] is not None and _pads_at_end(eqn):
                outs[0] = ins[0]
            elif name in _CALLS:
                sub = _call_jaxpr(eqn)
                if sub is not None and len(sub.invars) == len(ins):
                    visit(sub, ins)
                    outs = [held.get(id(v)) if id(v) not in not_held else None
                            for v in sub.outvars][:len(outs)]
            for var, region in zip(eqn.outvars, outs):
                mark(var, region)

    visit(closed_jaxpr.jaxpr, [tuple(int(d) for d in v.aval.shape)
                               for v in closed_jaxpr.jaxpr.invars])
    return {k: v for k, v in held.items() if k not in not_held}


def _pads_at_end(eqn: Any) -> bool:
    """A pad that only appends (no low or interior padding, no cropping)."""
    return all(int(lo) == 0 and int(hi) >= 0 and int(mid) == 0
               for lo, hi, mid in eqn.params["padding_config"])


def _call_jaxpr(eqn: Any) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None:
            return getattr(sub, "jaxpr", sub)
    return None


def check_grid(eqn: Any, arguments: dict[int, tuple[int, ...]] | None = None
               ) -> tuple[list[GridFinding], list[str]]:
    """Findings for one pallas_call equation over its grid, and what was not checked, and
    why. `arguments`: argument_regions() of the program it is in."""
    gm = eqn.params["grid_mapping"]
    if (not all(isinstance(g, (int, np.integer)) for g in gm.grid)
            or int(getattr(gm, "num_dynamic_grid_bounds", 0) or 0)):
        return [], ["the grid has a dynamic dimension"]
    grid = [int(g) for g in gm.grid]
    steps = math.prod(grid)
    if steps == 0:
        return [], []
    if steps > MAX_GRID_POINTS:
        return [], [f"the grid has {steps} points, over the {MAX_GRID_POINTS} evaluated"]
    n_in, n_pre = int(gm.num_inputs), int(gm.num_index_operands)
    unchecked: list[str] = []
    mappings = []
    points = np.indices(grid, dtype=np.int32).reshape(len(grid), steps) if grid else (
        np.zeros((0, 1), np.int32))
    for pos, bm in enumerate(gm.block_mappings):
        operand = f"input {pos}" if pos < n_in else f"output {pos - n_in}"
        why = _unchecked_reason(bm, len(grid))
        if why:
            unchecked.append(f"{operand}: {why}")
            continue
        try:
            indices = block_indices(bm, points, len(grid))
        except Exception as exc:  # a primitive that has no eager rule: say so, judge the rest
            unchecked.append(f"{operand}: its index map could not be evaluated ({type(exc).__name__})")
            continue
        mappings.append(_Mapping(pos, operand, [int(d) for d in bm.array_aval.shape],
                                 [_size(b) for b in bm.block_shape], str(bm.array_aval.dtype),
                                 indices))
    findings = [f for m in mappings if (f := _out_of_range(m, points)) is not None]
    bad = {f.operand for f in findings}
    aliased = {int(o) for _, o in eqn.params.get("input_output_aliases", ())}
    alias_inputs = {int(i) - n_pre for i, _ in eqn.params.get("input_output_aliases", ())}
    for m in mappings:
        if m.operand in bad or m.position < n_in:
            continue
        j = m.position - n_in
        if j in aliased:
            unchecked.append(f"{m.operand}: aliased to an input (blocks not written keep its values)")
        elif type(eqn.outvars[j]).__name__ == "DropVar":
            unchecked.append(f"{m.operand}: never used by the program")
        elif (f := _unwritten(m)) is not None:
            findings.append(f)
    operands = eqn.invars[n_pre:n_pre + n_in]
    findings += _unread([m for m in mappings if m.position < n_in and m.operand not in bad
                         and m.position not in alias_inputs], operands, arguments or {})
    return findings, unchecked


def _unchecked_reason(bm: Any, n_grid: int) -> str:
    aval = getattr(bm, "transformed_block_aval", None)
    space = str(getattr(aval, "memory_space", "") or "").lower()
    if any(s in space for s in ("any", "hbm", "semaphore")):
        return "outside the pipeline (moved by the kernel itself)"
    if reads_prefetched(bm, n_grid):
        return "its index map reads scalar-prefetch values"
    if any(_size(b, strict=True) == -1 for b in bm.block_shape):
        return "a block dim other than a block size or None (pl.Element, pl.BoundedSlice)"
    if len(bm.index_map_jaxpr.jaxpr.outvars) != len(bm.block_shape):
        return "its index map does not return one index per dim"
    return ""


def _size(b: Any, strict: bool = False) -> int | None:
    """Block size of a dim, None when squeezed; -1 (strict) for kinds not checked."""
    kind = type(b).__name__
    if b is None or kind == "Squeezed":
        return None
    if isinstance(b, (int, np.integer)):
        return int(b)
    if kind == "Blocked":
        return int(b.block_size)
    return -1 if strict else int(getattr(b, "block_size", 1))


def _finding(kind: str, m: _Mapping, index: Sequence[int], axis: int,
             point: Sequence[int] = ()) -> GridFinding:
    return GridFinding(kind, m.operand, list(m.dims), list(m.sizes), m.dtype,
                       [int(i) for i in index], int(axis), [int(p) for p in point])


def _out_of_range(m: _Mapping, points: np.ndarray) -> GridFinding | None:
    """The first grid step (in iteration order) whose block starts outside the array."""
    if not m.dims or any(d == 0 for d in m.dims):
        return None
    limits = np.asarray(m.n_blocks, np.int64)[:, None]
    bad = (m.indices < 0) | (m.indices >= limits)  # [dims, points]
    stepwise = bad.any(axis=0)
    if not stepwise.any():
        return None
    k = int(np.argmax(stepwise))
    axis = int(np.argmax(bad[:, k]))
    return _finding("out_of_range", m, m.indices[:, k], axis, points[:, k])


def _unwritten(m: _Mapping) -> GridFinding | None:
    """An output block that no grid step visits (all indices are in range here)."""
    if not m.dims or any(d == 0 for d in m.dims):
        return None
    n_blocks = m.n_blocks
    linear = np.unique(np.ravel_multi_index(tuple(m.indices), n_blocks))
    total = math.prod(n_blocks)
    if linear.size == total:
        return None
    gaps = np.nonzero(linear != np.arange(linear.size))[0]
    missing = int(gaps[0]) if gaps.size else int(linear.size)
    index = np.unravel_index(missing, n_blocks)
    axis = next((a for a in range(len(n_blocks))
                 if not np.any(m.indices[a] == index[a])), 0)
    return _finding("unwritten", m, index, axis)


def _unread(inputs: list[_Mapping], operands: Sequence[Any],
            arguments: dict[int, tuple[int, ...]]) -> list[GridFinding]:
    """kernel() arguments whose blocks (with those of other operands that are the same
    array) miss part of the argument's own elements along some axis."""
    groups: dict[int, list[_Mapping]] = {}
    for m in inputs:
        groups.setdefault(id(operands[m.position]), []).append(m)
    findings = []
    for var_id, group in groups.items():
        region = arguments.get(var_id)
        first = group[0]
        if region is None or len(region) != len(first.dims):
            continue
        for axis, (dim, need) in enumerate(zip(first.dims, region)):
            size = first.sizes[axis] or 1
            need = min(need, dim)
            if need == 0 or -(-dim // size) == 1:
                continue
            edges = np.zeros(dim + 1, np.int64)  # +1 where a read block starts, -1 past its end
            for m in group:
                step = m.sizes[axis] or 1
                starts = np.unique(m.indices[axis]) * step
                np.add.at(edges, starts, 1)
                np.add.at(edges, np.minimum(starts + step, dim), -1)
            covered = np.cumsum(edges[:need]) > 0
            if covered.all():
                continue
            index = [0] * len(first.dims)
            index[axis] = int(np.argmin(covered)) // size
            findings.append(_finding("unread", first, index, axis))
            break
    return findings


def refusal(f: GridFinding, kernel: str, case: str) -> tuple[str, str, str]:
    """(status, message, error type) for a finding at a case that is traced but not run: an
    out-of-range block is the runtime_error a TPU run (and interpret mode) would give; an
    output block never written, or an argument never read in full, gives wrong values with no
    error, so wrong_output."""
    array = f"the {f.describe_block()}"
    index = tuple(f.block_index)
    size = f.block_shape[f.axis] or 1
    start = f.block_index[f.axis] * size
    if f.kind == "out_of_range":
        return ("runtime_error",
                f"Out-of-bounds block index {index} for {f.operand} of kernel {kernel} at grid point "
                f"{tuple(f.grid_point)} at case {case}: along axis {f.axis} the block starts at "
                f"element {start} of {array}, past its end, so a TPU run would copy outside the "
                "array; make the index map return block indices below cdiv(dim, block) on every "
                "axis at every size (check which grid index it puts on which axis).", "IndexError")
    if f.kind == "unwritten":
        return ("wrong_output",
                f"{f.operand.capitalize()} of kernel {kernel} never writes block {index} of {array} "
                f"at case {case}: no grid step's index map returns it, so that part of the output "
                "keeps whatever memory held; the out_specs index map must visit every output block "
                "(check that each grid index it returns goes on the right axis and none is fixed).",
                "UnwrittenBlock")
    return ("wrong_output",
            f"{f.operand.capitalize()} of kernel {kernel} never reads elements {start}:{start + size} "
            f"along axis {f.axis} of {array}, a kernel() argument, at case {case}: no grid step's "
            f"index map returns block {f.block_index[f.axis]} on that axis, so the result ignores "
            "that part of the input; the in_specs index map must walk every block the computation "
            "needs (check that it uses the grid index of that axis, such as the reduction index).",
            "UnreadBlock")
