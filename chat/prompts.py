"""The text a model reads: system prompt, task prompt, evaluator feedback, and the answer format.

Only `train` cases ever reach a prompt; held-out cases and held-out tasks are for measuring
generalization and must stay unseen (tests/test_decontamination.py checks it).
"""
from __future__ import annotations

import ast
import inspect
import re
import types
from functools import cache

from chat.context import render_context
from evaluator.candidate.policy import parse_module
from evaluator.performance.hardware import DEFAULT_GENERATION
from evaluator.record import Verdict
from tasks.spec import Case, Task

ROLE = ("You are an expert in JAX Pallas kernels for TPU. You write kernels that compile for TPU, "
        "are numerically correct on every shape you are given, and keep the task's work inside "
        "Pallas kernels.")

RULES = """Rules:
- Answer with one complete Python module in a single ```python block that defines `{entry_point}` with the
  signature above; it may define helpers and use `jax`, `jax.numpy`, `jax.experimental.pallas` (as pl)
  and `jax.experimental.pallas.tpu` (as pltpu), `functools`, `math`, `numpy`.
- The task's arithmetic must run inside `pl.pallas_call` kernels; glue (reshapes, padding, casts) may
  stay outside. No matmul outside a kernel, no host callbacks.
- Do not pass `interpret=` to pallas_call: the grader decides how kernels run.
- No file, network, process or thread access."""


def system_prompt(context: str = "none", generation: str = DEFAULT_GENERATION) -> str:
    """Role, plus the hardware context the `--context` ablation asks for."""
    extra = render_context(context, generation)
    return ROLE if not extra else f"{ROLE}\n\n{extra}"


def reference_source(task: Task) -> str:
    """The reference as the model sees it: the import lines it needs, then, callees first, the
    source of every function and constant of ours it uses, as written.

    A reference uses only its own task module and tasks/references.py (the shared helpers):
    a name imported from there is shown as that helper's source, so the prompt is a
    self-contained module and exactly what the evaluator compares with. An imported task
    (suites/) shows the suite's file, its benchmark harness dropped.
    """
    if task.reference_text is not None:
        return task.reference_text.rstrip() + "\n"
    imports: list[str] = []
    defs: list[str] = []
    _resolve(inspect.getmodule(task.reference), task.reference.__name__, imports, defs)
    return "\n".join(imports) + "\n\n\n" + "\n\n\n".join(defs) + "\n"


def _resolve(module: types.ModuleType, name: str, imports: list[str], defs: list[str]) -> None:
    binding = _module_bindings(module).get(name)
    if binding is None:
        return  # a builtin or a parameter
    node, text = binding
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        value = getattr(module, name, None)
        if inspect.isfunction(value) and value.__module__.startswith("tasks."):
            _resolve(inspect.getmodule(value), value.__name__, imports, defs)  # a shared helper
        elif text not in imports:
            imports.append(text)
        return
    if text in defs:
        return
    for free in _free_names(node):
        _resolve(module, free, imports, defs)
    defs.append(text)


@cache
def _module_bindings(module: types.ModuleType) -> dict[str, tuple[ast.stmt, str]]:
    """name -> (the top-level statement that binds it, its source): imports, functions,
    classes and simple assignments."""
    source = inspect.getsource(module)
    found: dict[str, tuple[ast.stmt, str]] = {}
    for node in parse_module(source).body:
        names: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names = [node.targets[0].id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        for n in names:
            found[n] = (node, ast.get_source_segment(source, node))
    return found


def _free_names(node: ast.stmt) -> list[str]:
    """Names a definition reads but does not bind itself (its parameters and locals excluded)."""
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.Lambda))
              for a in (*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs,
                        *filter(None, (n.args.vararg, n.args.kwarg)))}
    bound |= {n.name for n in ast.walk(node) if isinstance(n, ast.FunctionDef) and n is not node}
    seen: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound and n.id not in seen:
            seen.append(n.id)
    return seen


def describe_case(task: Task, case: Case) -> str:
    """One line per case: the argument and output shapes and dtypes it is graded on."""
    args = ", ".join(f"{s.dtype}[{', '.join(map(str, s.shape))}]" for s in task.arg_specs(case))
    outs = ", ".join(f"{s.dtype}[{', '.join(map(str, s.shape))}]" for s in task.out_specs(case))
    return f"- ({args}) -> {outs}"


def task_prompt(task: Task, split: str = "train", *, evaluation: bool = False) -> str:
    """What the model is asked: the reference, the signature, the shapes of one split and the rules.

    Training data only ever shows train cases of non-held-out tasks. Only the re-benchmark
    (`evaluation=True`) may show held-out shapes or tasks: that is how generalization is measured.
    """
    if not evaluation and task.heldout_task:
        raise ValueError(f"task {task.name!r} is held out: it never goes into a training prompt")
    if not evaluation and split != "train":
        raise ValueError(f"split {split!r}: training prompts show train cases only")
    check = [describe_case(task, c) for c in task.select(split, "check")]
    bench = [describe_case(task, c) for c in task.select(split, "bench")]
    features = ""
    if task.required_features:
        features = ("\nThe kernel must use these TPU features: "
                    + ", ".join(task.required_features) + ".\n")
    return (
        f"Write a Pallas TPU kernel for the task `{task.name}`: {task.description}\n\n"
        f"Signature: `{task.signature}`\n\n"
        f"Reference implementation (pure JAX; your `{task.entry_point}` must match it):\n"
        f"```python\n{reference_source(task)}```\n\n"
        f"It is graded for correctness on these shapes:\n" + "\n".join(check) + "\n\n"
        "and compiled for TPU (and timed on hardware) at these larger ones:\n" + "\n".join(bench) + "\n"
        f"{features}\n{RULES.format(entry_point=task.entry_point)}\n"
    )


def task_messages(task: Task, context: str, generation: str = DEFAULT_GENERATION, split: str = "train", *,
                  evaluation: bool = False) -> list[dict[str, str]]:
    """The conversation's head: system prompt and task prompt."""
    return [{"role": "system", "content": system_prompt(context, generation)},
            {"role": "user", "content": task_prompt(task, split, evaluation=evaluation)}]


def repair_messages(head: list[dict[str, str]], failing_answer: str, verdict: Verdict) -> list[dict[str, str]]:
    """The head, the failing answer and the evaluator's feedback on it: what a repair answers."""
    return head + [{"role": "assistant", "content": failing_answer},
                   {"role": "user", "content": feedback(verdict)}]


def feedback(verdict: Verdict) -> str:
    """The evaluator's verdict as the model reads it, and what to do next."""
    return (f"The evaluator rejected this kernel.\n\n{machine_free(verdict.message)}\n\n"
            "Explain what is wrong, then give the complete corrected module in one ```python block.")


# A path into an installed package, up to the package: `/.../site-packages/jax/_src/x.py` -> `jax/_src/x.py`.
_INSTALL_PREFIX = re.compile(r"(?:[A-Za-z]:)?[\\/](?:[^\s'\"()\\/]+[\\/])*?(?:site|dist)-packages[\\/]")
# Any other absolute path on this machine: only its file name is kept.
_LOCAL_PATH = re.compile(r"(?<![\w.>])/(?:[^\s'\"():/]+/)+([^\s'\"():/]+)")
# The input seeds a case was graded on: they vary per run and teach nothing.
_SEED = re.compile(r",? (?:input )?seeds? \d+(?:, \d+)*|\bseed=\d+,? ?")


def machine_free(message: str) -> str:
    """The evaluator's message without what belongs to this machine or this run: paths into the
    installed packages become package-relative (`jax/_src/...`), other local paths keep their
    file name, and seeds go. The verdict itself keeps everything."""
    message = _INSTALL_PREFIX.sub("", message)
    message = _LOCAL_PATH.sub(r"\1", message)
    return _SEED.sub("", message)


def code_block(source: str) -> str:
    return f"```python\n{source.rstrip()}\n```"


def strip_code(answer: str) -> str:
    """The prose of an answer without its fenced code blocks (a repair's explanation)."""
    out, inside = [], False
    for line in answer.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out).strip()
