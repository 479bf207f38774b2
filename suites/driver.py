"""Our side of a peer suite's file, run inside a sandboxed worker (protocol `Call`).

The host never executes a JAXBench or KernelBench-JAX file: it sends the file's text (rewritten
to the case's sizes, harness dropped) and names one of these functions; the worker executes the
text as a module and calls the function on it (evaluator/execution/handlers.py `call_external`). Each
returns (JSON-able value, arrays).

Two kinds of file:
- "workload" (JAXBench `benchmark/*/baseline.py`): `create_inputs(dtype=...)` and a positional
  `workload(*inputs)`;
- "model" (KernelBench-JAX `jaxkernelbench/level*/*.py`): `Model(*get_init_inputs())` with its
  weights as array attributes, `Model.forward(*get_inputs())`. The weights become arguments
  after the inputs, so the reference and a candidate's `ModelNew` get the same values.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
from typing import Any, Iterator

import numpy as np

# What lets a worker call these functions (evaluator/execution/handlers.py call_external): nothing else may be named.
REFERENCE_DRIVER = True
FLOAT_KINDS = "fc"


@contextlib.contextmanager
def seeded_keys(seed: int) -> Iterator[None]:
    """Make `jax.random.key(n)` / `PRNGKey(n)` (what their input makers call with a fixed n)
    depend on our seed too, so each seed draws other values from their own distributions."""
    import jax

    key, prng_key = jax.random.key, jax.random.PRNGKey
    jax.random.key = lambda n, *a, **k: jax.random.fold_in(key(n, *a, **k), seed)
    jax.random.PRNGKey = lambda n, *a, **k: jax.random.fold_in(prng_key(n, *a, **k), seed)
    try:
        yield
    finally:
        jax.random.key, jax.random.PRNGKey = key, prng_key


def _is_array(value: Any) -> bool:
    import jax

    return isinstance(value, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))


def _make_args(module: types.ModuleType, kind: str, dtype: str) -> tuple[list[Any], list[str], int]:
    """(arguments, their names, how many are inputs) as the file makes them; the rest are
    the model's weights."""
    import jax.numpy as jnp

    if kind == "workload":
        maker = module.create_inputs
        takes_dtype = "dtype" in inspect.signature(maker).parameters
        values = list(maker(dtype=jnp.dtype(dtype)) if takes_dtype else maker())
        names = _parameter_names(module.workload, len(values))
        _require_arrays(values, names, "create_inputs()")
        return values, names, len(values)
    inputs = list(module.get_inputs())
    names = _parameter_names(module.Model.forward, len(inputs), skip_self=True)
    _require_arrays(inputs, names, "get_inputs()")
    model = module.Model(*module.get_init_inputs())
    weights = [(f"self.{k}", v) for k, v in vars(model).items() if _is_array(v)]
    return inputs + [v for _, v in weights], names + [k for k, _ in weights], len(inputs)


def _parameter_names(fn: Any, n: int, skip_self: bool = False) -> list[str]:
    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][int(skip_self):]
    return [params[i] if i < len(params) else f"arg{i}" for i in range(n)]


def _require_arrays(values: list[Any], names: list[str], maker: str) -> None:
    for name, value in zip(names, values):
        if not _is_array(value):
            raise TypeError(f"{maker} returns {name} as a Python {type(value).__name__}, not an "
                            "array: a static argument, which a kernel's positional array "
                            "signature cannot take")


def _call_reference(module: types.ModuleType, kind: str, n_inputs: int, args: list[Any]) -> Any:
    if kind == "workload":
        return module.workload(*args)
    model = module.Model(*module.get_init_inputs())
    names = [k for k, v in vars(model).items() if _is_array(v)]
    for name, value in zip(names, args[n_inputs:]):
        setattr(model, name, value)
    return model.forward(*args[:n_inputs])


def _upcast(a: Any) -> Any:
    return a.astype(np.float32) if np.dtype(a.dtype).kind in FLOAT_KINDS else a


def describe(module: types.ModuleType, kind: str, dtype: str) -> tuple[dict[str, Any], list]:
    """Argument and output shapes, names, the model's init inputs and the reference's cost,
    all abstract (jax.eval_shape): nothing of bench size is allocated."""
    import jax

    from evaluator.analysis.jaxpr_cost import total_cost

    made: dict[str, Any] = {}

    def make() -> list[Any]:
        args, made["names"], made["n_inputs"] = _make_args(module, kind, dtype)
        return args

    args = jax.eval_shape(make)
    n_inputs = made["n_inputs"]
    out = jax.eval_shape(lambda *a: _call_reference(module, kind, n_inputs, list(a)), *args)
    upcast = [jax.ShapeDtypeStruct(a.shape, np.float32 if np.dtype(a.dtype).kind in FLOAT_KINDS
                                   else a.dtype) for a in args]
    cost = total_cost(jax.make_jaxpr(lambda *a: _call_reference(module, kind, n_inputs, list(a)))(*upcast))
    init = [_plain(v) for v in module.get_init_inputs()] if kind == "model" else []
    return {
        "args": [[list(a.shape), np.dtype(a.dtype).name] for a in args],
        "names": made["names"],
        "n_inputs": n_inputs,
        "outs": [[list(o.shape), np.dtype(o.dtype).name] for o in jax.tree_util.tree_leaves(out)],
        "cost": dataclasses.asdict(cost),
        "init": init,
    }, []


def _plain(value: Any) -> Any:
    """An init input as JSON (the shim rebuilds ModelNew from it): numbers, strings, None,
    and lists of them."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"get_init_inputs() returns a {type(value).__name__}; only numbers, strings "
                    "and lists of them can be handed to ModelNew")


def sample(module: types.ModuleType, kind: str, dtype: str, seed: int) -> tuple[dict[str, Any], list]:
    """One seed's arguments and the reference's outputs on them (float32, on float32-upcast
    arguments, as for our own tasks).

    Degenerate inputs are repaired here: when the reference's output is constant (JAXBench's
    KernelBench-derived workloads make all-zero weights, so a kernel returning zeros would
    pass), every all-zero float argument is redrawn, seeded, as N(0, 1/fan_in), and the value
    says which. An output still constant after that is reported, not hidden."""
    with seeded_keys(seed):
        args, names, n_inputs = _make_args(module, kind, dtype)
    args = [np.asarray(a) for a in args]
    outputs = _outputs(module, kind, n_inputs, args)
    repaired: list[str] = []
    if _constant(outputs):
        rng = np.random.default_rng(seed)
        for i, a in enumerate(args):
            if a.dtype.kind in FLOAT_KINDS and a.size and not np.any(a.astype(np.float32)):
                args[i] = (rng.standard_normal(a.shape) * _weight_scale(a.shape)).astype(a.dtype)
                repaired.append(names[i])
        if repaired:
            outputs = _outputs(module, kind, n_inputs, args)
    return {"n_args": len(args), "repaired": repaired, "constant_output": _constant(outputs)}, args + outputs


def _weight_scale(shape: tuple[int, ...]) -> float:
    """1/sqrt(fan-in), so a redrawn weight keeps activations O(1): a matrix is stored (in, out)
    or (out, in) depending on the file, hence its larger side; a conv weight (O, I, *window)
    has I * window; a vector (a bias) gets 0.5."""
    if len(shape) < 2:
        return 0.5
    fan_in = max(shape) if len(shape) == 2 else int(np.prod(shape[1:]))
    return 1.0 / float(np.sqrt(max(fan_in, 1)))


def reference(module: types.ModuleType, kind: str, n_inputs: int, tpu_dots: bool,
              *args: np.ndarray) -> tuple[dict, list]:
    """The reference's outputs on given arguments (a seed's, or the timed bench-size inputs);
    with `tpu_dots`, its dots rounded as a TPU rounds them (the grader's per-element slack)."""
    return {}, _outputs(module, kind, n_inputs, list(args), tpu_dots)


def timed_reference(module: types.ModuleType, kind: str, n_inputs: int) -> Any:
    """The reference as a function of the arrays, as the timing stage times it beside a kernel
    (evaluator/execution/handlers.py time_case): their own code at the case's dtypes, nothing upcast."""
    return lambda *args: _call_reference(module, kind, n_inputs, list(args))


def _outputs(module: types.ModuleType, kind: str, n_inputs: int, args: list[np.ndarray],
             tpu_dots: bool = False) -> list[np.ndarray]:
    import jax

    from evaluator.execution.program import with_tpu_dots

    def call(*a: Any) -> Any:
        return _call_reference(module, kind, n_inputs, list(a))

    fn = jax.jit(with_tpu_dots(call) if tpu_dots else call)
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(fn(*[_upcast(a) for a in args]))]


def _constant(outputs: list[np.ndarray]) -> bool:
    """Every output a single repeated value (all zeros, log(n), 1/n...). A lone scalar (a
    mean loss) says nothing by itself, so outputs of one element are not judged."""
    if all(o.size <= 1 for o in outputs):
        return False
    return all(o.size <= 1 or np.all(o == o.reshape(-1)[0]) for o in outputs)
