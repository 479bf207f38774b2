"""The candidate's program as traced: what the structure stage analysed is what runs.

The worker traces `kernel()` once per case (`jax.make_jaxpr`), and every later step works on
that jaxpr: the structure and feature checks read it, the TPU lowering and the libtpu compile
lower it, the run stage executes it and a TPU times it. The candidate's Python is never
called again, so a kernel cannot show the checks one program and run another (one that
counts its own traces, say).

`replay(program, interpret=...)` evaluates the jaxpr equation by equation. Each `pallas_call`
is issued again with the evaluator's interpret parameters (or as traced, for a TPU), and
control flow (scan, while, cond) and `shard_map` are rebuilt around bodies replayed the same
way. Calls (jit, custom_vjp, custom_jvp, remat, custom_vmap, custom_partitioning) are inlined:
only the forward program runs. A pallas_call inside any other higher-order primitive cannot
be replayed in interpret mode yet: `replay_limits` names those primitives, so the grader can
say that it is its own limit (status `grader_limit`), not the kernel's fault.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import jax
from jax import lax
from jax.extend import core as jcore, source_info_util

from evaluator.analysis.jaxpr_walk import is_closed_jaxpr, is_jaxpr, sub_jaxprs

# Call-like primitives whose body is inlined; the parameter that holds it. (jax.checkpoint is
# "remat2" in jax 0.10.) custom_partitioning's callbacks only split a program over several
# devices: on one, jax lowers it as its body (jax/_src/custom_partitioning.py), and one device
# is all the grader runs on. custom_vmap's rule only applies under vmap, which tracing did.
_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "remat": "jaxpr", "checkpoint": "jaxpr", "remat2": "jaxpr", "custom_jvp_call": "call_jaxpr",
            "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
            "custom_vmap_call": "call", "custom_partitioning": "call"}
# Higher-order primitives rebuilt around replayed bodies (a kernel inside them runs as the
# replay says); a pallas_call inside any other one is a limit of the replay (ReplayLimit).
_REBUILT = frozenset({"scan", "while", "cond", "shard_map"})


# XLA's CPU compile of the programs a grading runs on the host CPU was most of a grading (54%
# of the 40 solutions'). The older loop emitters cut it by 30-40% and left every output
# bitwise equal (80 interpret-mode cases of the solutions, 120 reference cases): the host's
# references compile so. An interpret-mode program's run is mostly host callbacks, which no
# optimisation speeds up, so it also gets no LLVM optimisation: half the compile in all; its
# outputs were bitwise equal on 59 of 80 cases and differed in the last bits on the rest (the
# order in which a reduction adds, which a TPU does its own way), and no verdict on any corpus
# changed (benchmarks/seed_checks_agreement.py, docs/architecture.md "Grading speed"). Nor is
# its LLVM module split to be compiled on several threads: the host's work fills the other core,
# and one piece took a fifth less time and a quarter less CPU (16 cases of 4 solutions).
REFERENCE_COMPILE_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
INTERPRET_COMPILE_OPTIONS = {**REFERENCE_COMPILE_OPTIONS, "xla_backend_optimization_level": 0,
                             "xla_cpu_parallel_codegen_split_count": 1}


class ReplayLimit(NotImplementedError):
    """A pallas_call inside a primitive that the interpret-mode replay cannot rebuild yet: a
    limit of the grader, not a fault of the kernel."""


@dataclass
class TracedProgram:
    """One case's program: the jaxpr and how its flat outputs map back to kernel()'s result."""

    closed: Any  # ClosedJaxpr
    out_tree: Any  # PyTreeDef of kernel()'s result

    @classmethod
    def trace(cls, fn: Callable[..., Any], specs: Sequence[jax.ShapeDtypeStruct]) -> "TracedProgram":
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*specs)
        return cls(closed, jax.tree_util.tree_structure(out_shape))

    def pallas_calls(self) -> list[Any]:
        """Every pallas_call equation, also inside control flow and calls."""
        return list(_pallas_eqns(self.closed.jaxpr))

    def replay_limits(self) -> list[str]:
        """The primitives around a pallas_call that replay(interpret=...) cannot rebuild, by
        name (none for most programs). Replayed for a TPU, every program runs as traced."""
        return sorted(set(_replay_limits(self.closed.jaxpr)))


def replay(program: TracedProgram, interpret: Any = None,
           tpu_numerics: bool = False) -> Callable[..., Any]:
    """A function of kernel()'s arguments that evaluates the traced program.

    `interpret`: None keeps every pallas_call as traced (for TPU lowering, compiling, timing);
    otherwise each is issued with `interpret=<this>` (e.g. pltpu.InterpretParams(...)), and
    with `tpu_numerics` its dots compute as a TPU's MXU does (tpu_dot_numerics).
    """
    fix = None if interpret is None else partial(interpret_call_params, interpret=interpret,
                                                 tpu_numerics=tpu_numerics)

    def run(*args: Any) -> Any:
        flat = jax.tree_util.tree_leaves(args)
        outs = _eval(program.closed.jaxpr, program.closed.consts, flat, fix)
        return jax.tree_util.tree_unflatten(program.out_tree, outs)

    return run


def interpret_call_params(params: dict[str, Any], interpret: Any,
                          tpu_numerics: bool = False) -> dict[str, Any]:
    """A pallas_call's parameters for interpret mode (`tpu_numerics`: see tpu_dot_numerics).

    vmap adds its batch axes to the grid but not to `dimension_semantics`; Mosaic marks those
    axes "parallel" when it lowers (jax/_src/pallas/mosaic/lowering.py), while TPU interpret
    mode reads the semantics as given and fails on the length mismatch. Do what Mosaic does,
    so a kernel that lowers for TPU also runs here.
    """
    new = dict(params, interpret=interpret)
    if tpu_numerics:
        new["jaxpr"] = tpu_dot_numerics(params["jaxpr"])
    vmapped = tuple(getattr(params["grid_mapping"], "vmapped_dims", ()) or ())
    compiler_params = params.get("compiler_params")
    semantics = getattr(compiler_params, "dimension_semantics", None)
    if vmapped and semantics is not None:
        grid_len = len(params["grid_mapping"].grid)
        given = iter(semantics)
        full = tuple("parallel" if i in vmapped else next(given) for i in range(grid_len))
        new["compiler_params"] = dataclasses.replace(compiler_params, dimension_semantics=full)
    return new


def _eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
          fix: Callable[[dict[str, Any]], dict[str, Any]] | None) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    if len(jaxpr.invars) != len(args):
        raise TypeError(f"the traced program takes {len(jaxpr.invars)} arrays, got {len(args)}")
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        # Keep each equation's source location: errors then point at the candidate's line.
        with source_info_util.user_context(eqn.source_info.traceback,
                                           name_stack=eqn.source_info.name_stack), eqn.ctx.manager:
            outs = _eval_eqn(eqn, invals, fix)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _eval_eqn(eqn: Any, invals: list[Any], fix: Callable | None) -> Any:
    name, params = eqn.primitive.name, eqn.params
    if name == "pallas_call":
        return eqn.primitive.bind(*invals, **(fix(params) if fix else params))
    if name in _INLINED and _INLINED[name] in params:
        body = params[_INLINED[name]]
        inner, consts = (body.jaxpr, body.consts) if is_closed_jaxpr(body) else (body, ())
        return _eval(inner, consts, invals, fix)
    if name == "scan":
        return _scan(params, invals, fix)
    if name == "while":
        return _while(params, invals, fix)
    if name == "cond":
        return _cond(params, invals, fix)
    if name == "shard_map":
        return _shard_map(params, invals, fix)
    if fix is not None and any(True for _ in _pallas_eqns_in(eqn)):
        raise ReplayLimit(f"a pallas_call inside {name!r} cannot be replayed in interpret mode yet")
    # Anything else runs as traced: with no pallas_call inside, or for the TPU, where the
    # kernels keep their traced parameters, binding the equation again is the program itself.
    return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))


def _replay_limits(jaxpr: Any) -> Any:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            continue
        if name in _REBUILT or _INLINED.get(name) in eqn.params:
            for sub in sub_jaxprs(eqn):
                yield from _replay_limits(sub)
        elif any(True for _ in _pallas_eqns_in(eqn)):
            yield name


def _shard_map(params: dict[str, Any], invals: list[Any], fix: Callable | None) -> list[Any]:
    """shard_map again, with the traced mesh and specs around the replayed body (the body
    sees each device's block, and collectives find their mesh axes)."""
    body = params["jaxpr"]
    mapped = jax.shard_map(lambda *args: tuple(_eval(body, (), args, fix)), mesh=params["mesh"],
                           in_specs=tuple(params["in_specs"]), out_specs=tuple(params["out_specs"]),
                           axis_names=set(params["newly_manual_axes"]), check_vma=params["check_vma"])
    return list(mapped(*invals))


def _closed_fn(closed: Any, fix: Callable | None) -> Callable[..., list[Any]]:
    return lambda *args: _eval(closed.jaxpr, closed.consts, args, fix)


def _scan(params: dict[str, Any], invals: list[Any], fix: Callable | None) -> list[Any]:
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
    body = _closed_fn(params["jaxpr"], fix)

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = body(*consts, *carry, *x)
        return list(outs[:n_carry]), list(outs[n_carry:])

    carry, ys = lax.scan(step, list(init), list(xs), length=params["length"],
                         reverse=params["reverse"], unroll=params["unroll"])
    return [*carry, *ys]


def _while(params: dict[str, Any], invals: list[Any], fix: Callable | None) -> list[Any]:
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts, init = invals[:nc], invals[nc:nc + nb], invals[nc + nb:]
    cond = _closed_fn(params["cond_jaxpr"], fix)
    body = _closed_fn(params["body_jaxpr"], fix)
    return list(lax.while_loop(lambda c: cond(*cond_consts, *c)[0],
                               lambda c: list(body(*body_consts, *c)), list(init)))


def _cond(params: dict[str, Any], invals: list[Any], fix: Callable | None) -> list[Any]:
    index, operands = invals[0], invals[1:]
    branches = [_closed_fn(b, fix) for b in params["branches"]]
    return list(lax.switch(index, branches, *operands))


def _pallas_eqns_in(eqn: Any) -> Any:
    for sub in sub_jaxprs(eqn):
        yield from _pallas_eqns(sub)


def _pallas_eqns(jaxpr: Any) -> Any:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        else:
            yield from _pallas_eqns_in(eqn)


# --- TPU numerics for dots inside kernels ----------------------------------------------------
# On a CPU a kernel's f32 `dot_general` is exact f32. On a TPU, Mosaic lowers a dot at DEFAULT
# precision without a contract-precision attribute (jax/_src/pallas/mosaic/lowering.py,
# `_dot_general_lowering_rule`), and the MXU then takes f32 operands as bfloat16: one pass,
# f32 accumulation. Precision.HIGHEST becomes `#tpu.contract_precision<fp32>` (full f32);
# other settings do not lower. So in interpret mode, f32 operands of a DEFAULT-precision dot
# are rounded to bfloat16 (round to nearest even) and the dot accumulates in f32 as before.
_BF16_BITS = {"exponent_bits": 8, "mantissa_bits": 7}


# XLA on a TPU computes a DEFAULT-precision f32 dot or convolution the same way (one bf16 pass),
# so the same rewrite of a reference gives its outputs as a TPU computes them (with_tpu_dots).
# A ragged dot (`lax.ragged_dot`: grouped matmul and MoE references) is a dot on the MXU too;
# left out, its references kept f32 products, and the bound lost its rounding term: an honest
# gated_grouped_matmul kernel failed one element in 12 million at one seed.
_MXU_PRIMITIVES = frozenset({"dot_general", "ragged_dot_general", "conv_general_dilated"})


def with_tpu_dots(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its DEFAULT-precision f32 dots and convolutions computed as a TPU computes
    them: the grader's measure of how far TPU rounding alone moves a reference's outputs."""

    def run(*args: Any) -> Any:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = _eval(tpu_dot_numerics(closed.jaxpr), closed.consts, jax.tree_util.tree_leaves(args), None)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return run


def tpu_dot_numerics(jaxpr: Any) -> Any:
    """The jaxpr with every DEFAULT-precision f32 dot's (and convolution's) operands rounded
    to bf16."""
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        params = {k: _rewrite_param(v) for k, v in eqn.params.items()}
        if any(params[k] is not eqn.params[k] for k in params):
            eqn, changed = eqn.replace(params=params), True
        if eqn.primitive.name in _MXU_PRIMITIVES and _default_precision(eqn.params.get("precision")):
            operands = []
            for var in eqn.invars[:2]:
                if isinstance(var, jcore.Var) and str(var.aval.dtype) == "float32":
                    rounded = jcore.Var(var.aval)
                    eqns.append(jcore.new_jaxpr_eqn([var], [rounded], lax.reduce_precision_p,
                                                    dict(_BF16_BITS), jcore.no_effects,
                                                    eqn.source_info))
                    operands.append(rounded)
                    changed = True
                else:
                    operands.append(var)
            eqn = eqn.replace(invars=[*operands, *eqn.invars[2:]])
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _rewrite_param(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        items = [_rewrite_param(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if is_closed_jaxpr(value):
        inner = tpu_dot_numerics(value.jaxpr)
        return value if inner is value.jaxpr else value.replace(jaxpr=inner)
    if is_jaxpr(value):
        return tpu_dot_numerics(value)
    return value


def _default_precision(precision: Any) -> bool:
    """DEFAULT precision (None, or DEFAULT for both operands); not an explicit algorithm."""
    if precision is None:
        return True
    values = precision if isinstance(precision, (tuple, list)) else (precision,)
    return all(v is None or v == lax.Precision.DEFAULT for v in values)
