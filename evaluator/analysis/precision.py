"""Arithmetic below the task's precision: dots on int8/fp8 operands in a float task.

A float task asks for float arithmetic. A kernel that quantises its float inputs to int8 (or
fp8) inside the body and multiplies those on the MXU computes at a precision the task never
offered; per-chunk scales keep its error near an f32 task's L2 bound (an int8-per-128-K-chunk
matmul reaches relative L2 9.0e-3..1.1e-2, an honest one 2.4e-3..3.1e-3), so the tolerance
alone would judge it by luck. The worker lists such dots per kernel (`low_precision_dots`, read
from the kernel jaxpr); the structure stage refuses them where every kernel() input is a float
(matmul_int8_scaled and dequant_matmul take int8 data and may multiply it as int8). Imported
tasks (suites/) are not judged: their reference is third-party code that may quantise itself.
"""
from __future__ import annotations

from typing import Any, Sequence

from evaluator.analysis.jaxpr_walk import sub_jaxprs

# Operand dtypes below any float task's precision (names as jax prints them).
LOW_PRECISION_PREFIXES: tuple[str, ...] = ("int8", "uint8", "int4", "uint4", "int2", "uint2",
                                           "float8", "float4")
# Input dtypes of a float task: an int8/fp8 input (matmul_int8_scaled) allows int8/fp8 dots.
FLOAT_INPUTS: frozenset[str] = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_low_precision(dtype: str) -> bool:
    return dtype.startswith(LOW_PRECISION_PREFIXES)


def low_precision_dots(kernel_jaxpr: Any) -> list[str]:
    """One description per dot_general in the kernel body (nested bodies included) with an
    int8/fp8 operand, e.g. "int8 x int8 -> int32"; empty for a kernel without any."""
    found: list[str] = []
    for eqn in kernel_jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            dtypes = [str(getattr(v.aval, "dtype", "")) for v in eqn.invars[:2]]
            if any(is_low_precision(d) for d in dtypes):
                out = str(getattr(eqn.outvars[0].aval, "dtype", "")) if eqn.outvars else "?"
                found.append(f"{dtypes[0]} x {dtypes[1]} -> {out}")
        for sub in sub_jaxprs(eqn):
            found += low_precision_dots(sub)
    return found


def float_inputs_only(arg_dtypes: Sequence[str]) -> bool:
    """True when every kernel() input is a float array (no integer, quantised or bool data)."""
    return all(d in FLOAT_INPUTS for d in arg_dtypes)


def precision_message(kernels: list[tuple[str, list[str]]], case_name: str, task_name: str) -> str:
    """One sentence naming the kernel and its dots, and what to do instead."""
    name, dots = kernels[0]
    shown = ", ".join(sorted(set(dots))[:3])
    return (f"kernel {name} at case {case_name} multiplies low-precision operands ({shown}), but "
            f"every input of {task_name} is a float: quantising float inputs to int8/fp8 computes "
            "below the task's precision; multiply in the inputs' own dtype (f32 or bf16) with an "
            "f32 accumulator.")


def low_precision_finding(calls: Sequence[Any], arg_dtypes: Sequence[str], case_name: str,
                          task_name: str) -> str | None:
    """The message for a float task's kernels (PallasCallInfo) that multiply int8/fp8
    operands, else None."""
    if not float_inputs_only(arg_dtypes):
        return None
    kernels = [(c.name, c.low_precision_dots) for c in calls if getattr(c, "low_precision_dots", None)]
    return precision_message(kernels, case_name, task_name) if kernels else None
