import threading

import pytest

from evaluator.candidate import policy
from tasks import all_tasks
from tests.conftest import HONEST


def flagged(source: str) -> list[str]:
    return [v.message for v in policy.violations(policy.parse(source))]


@pytest.mark.parametrize("source", [
    "import os",
    "import sys",
    "import gc",
    "import inspect",
    "import ctypes",
    "import threading",
    "import subprocess",
    "import socket",
    "import time",
    "import importlib",
    "from jax._src import core",
    "x = open('f').read()",
    "eval('1')",
    "exec('x = 1')",
    "__import__('os')",
    "f = globals()['kernel']",
    "y = ().__class__.__base__.__subclasses__()",
    "z = getattr(jax, name)",
    "z = getattr(jax, '__dict__')",
    "out = pl.pallas_call(k, out_shape=s, interpret=True)(x)",
    "out = pl.pallas_call(k, out_shape=s, **{'interpret': True})(x)",
    "pltpu.force_tpu_interpret_mode(p)",
    "jax.config.update('jax_enable_x64', True)",
    "import numpy as np\nnp.save('x.npy', a)",
    "import numpy as onp\na = onp.load('x.npy')",
    "setattr(pl, 'pallas_call', f)",
    # builds code at run time: FunctionType/CodeType would get past the static policy
    "import types",
    "import pickle",
    "import ast",
    "import io",
    "import pathlib",
    "import builtins",
    "import traceback",
    # object.__setattr__ only as a frozen dataclass sets its own field
    "object.__setattr__(pl, 'pallas_call', f)",
    "def f(x):\n    object.__setattr__(x, 'a', 1)",
    "class A:\n    def f(self, other):\n        object.__setattr__(other, 'a', 1)",
    "class A:\n    def f(self):\n        object.__setattr__(self, '__class__', B)",
    "class A:\n    def f(self):\n        g = object.__setattr__",
    "out = pl.pallas_call(k, out_shape=s, interpret=1)(x)",
])
def test_forbidden_code_is_flagged(source):
    assert flagged(source), source


@pytest.mark.parametrize("source", [
    "import jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl",
    "from jax.experimental.pallas import tpu as pltpu\nimport functools, math",
    "x = pl.load(ref, idx)\ny = pltpu.load(ref)",  # Pallas' own load is not numpy file I/O
    "if __name__ == '__main__':\n    pass",
    "v = getattr(pltpu, 'CompilerParams', None)",
    # the pure-computation standard library that real kernel code imports
    "import re, json, warnings, abc, contextlib, copy, numbers, string, textwrap",
    "import collections.abc\nfrom collections.abc import Sequence",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask",
    # interpret as a parameter (default False) passed through, as in jax's own kernels
    "def f(x, interpret=False):\n    return pl.pallas_call(k, out_shape=s, interpret=interpret)(x)",
    "out = pl.pallas_call(k, out_shape=s, interpret=False)(x)",
    # the frozen-dataclass idiom
    "@dataclasses.dataclass(frozen=True)\nclass B:\n    x: int\n    def __post_init__(self):\n"
    "        object.__setattr__(self, 'x', 2 * self.x)",
])
def test_ordinary_kernel_code_is_allowed(source):
    assert flagged(source) == []


def test_all_reference_and_honest_solutions_pass_the_policy():
    sources = [t.solution_source() for t in all_tasks()] + [p.read_text() for p in HONEST.glob("*.py")]
    for source in sources:
        assert flagged(source) == []


def test_syntax_error_reports_the_line():
    with pytest.raises(policy.PolicySyntaxError, match="line 2"):
        policy.parse("def kernel(x):\n    return (x\n")


def test_parse_is_safe_from_many_threads():
    """The grader parses on threads; CPython 3.11's ast raises SystemError when two parse at once."""
    sources = [t.solution_source() for t in all_tasks()]
    errors: list[BaseException] = []

    def parse_all() -> None:
        for _ in range(4):
            for source in sources:
                try:
                    policy.parse(source)
                except BaseException as exc:  # noqa: BLE001 - any escape is the failure under test
                    errors.append(exc)

    threads = [threading.Thread(target=parse_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
