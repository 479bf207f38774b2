import importlib.util
import os
import re
from pathlib import Path

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")  # tests pin the tpu-interpret backend
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # with libtpu installed, jax would probe for a TPU
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes share the cores: torch's OpenMP threads (one per core each) spun against
    # the other process's work, and `pytest -m slow` ran its GRPO test in 392 s, not 45 (alone).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CANDIDATES = TESTS / "candidates"
HONEST = TESTS / "honest"
PEER_FIXTURE = TESTS / "peer_suites" / "jaxbench"  # a JAXBench checkout in miniature, in their formats


# CI installs every prerequisite (the README's extras, and the CI-only list in .ci/run), so
# there a missing one is a broken CI, not a reason to skip.
IN_CI = os.environ.get("CI") == "true"


# Test processes under `pytest -n auto` (pyproject.toml): each holds its own warm graders and their
# sandboxed workers (a few GiB), so more than this costs memory without saving time on most machines.
MAX_TEST_PROCESSES = 2


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(os.cpu_count() or 1, MAX_TEST_PROCESSES))


def require(available: bool, reason: str) -> None:
    """Skip (module level too) when a prerequisite is missing; fail instead under CI=true."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"CI prerequisite missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, install: str) -> None:
    require(importlib.util.find_spec(name) is not None, f"{name} is not installed ({install})")


# --- Tiers (docs/testing.md, "Tiers") ---------------------------------------------------------
# `pytest` runs the default suite: every unit test and, of each collection the grader is run over
# (the tasks, the red team, third-party kernels, honest styles), a fixed sample; `pytest -m slow`
# runs the rest of each collection, and CI runs both. The tasks' sample spans the three levels and
# the features the grader checks: the design's own tasks (softmax, matmul, causal attention, paged
# attention), a VMEM accumulator (swiglu_mlp), scalar prefetch (mla_decode_attention,
# ragged_attention), manual DMA (paged_attention), a held-out task (ragged_attention).
SAMPLE_TASKS = ("softmax", "matmul", "swiglu_mlp", "mla_decode_attention", "attention_fwd_causal",
                "paged_attention", "ragged_attention")


def sampled(items, sample, ids=str, key=None) -> list:
    """`items` as the parameters of one test: those whose `key` (default: their test id) is in
    `sample` run in the default suite, the others are marked `slow`. `ids(item)` is an item's test
    id, which it keeps in either tier; an item that is already a `pytest.param` keeps its id and
    marks. A sample naming nothing in `items` is an error: a renamed kernel must not drop out of
    the default suite unnoticed."""
    params = [item if isinstance(item, pytest.ParameterSet)
              else pytest.param(*(item if isinstance(item, tuple) else (item,)), id=ids(item)) for item in items]
    keys = [p.id if key is None else key(*p.values) for p in params]
    unknown = set(sample) - set(keys)
    if unknown:
        raise ValueError(f"the default sample names {sorted(unknown)}, which no parameter has")
    return [p if k in sample else pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow))
            for p, k in zip(params, keys)]


def read_candidate(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


# A test kernel says which task it is for and the status it must get: `task: NAME  expect: STATUS`,
# at the end of its docstring (tests/redteam/) or on its last line (tests/candidates/).
EXPECTATION = re.compile(r"task:\s*(\w+)\s+expect:\s*(\w+)")


def expectation(path: Path) -> tuple[str, str] | None:
    """(task, expected status) a test kernel declares, or None."""
    found = EXPECTATION.search(path.read_text())
    return (found.group(1), found.group(2)) if found else None


@pytest.fixture(scope="session")
def evaluator():
    """One warm evaluator for the whole session, for tests that check a verdict's status and
    message: one seed per case, and a failing kernel's later cases are not run. The stages and
    the verdict are the grader's own; what it skips costs half of a grading and decides nothing
    a status test asserts."""
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu-interpret", workers=1, n_seeds=1, stop_at_first_failure=True) as ev:
        yield ev


@pytest.fixture(scope="session")
def full_evaluator():
    """The grader as a user runs it (two seeds per case, every case run): for tests about
    per-case results, seeds and what a whole grading reports."""
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu-interpret", workers=1) as ev:
        yield ev


@pytest.fixture(scope="session")
def quick_timeout_evaluator():
    """Short step limit, for the candidates that hang."""
    from evaluator.execution.sandbox import Limits
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu-interpret", workers=1, limits=Limits(step_timeout_s=8)) as ev:
        yield ev


@pytest.fixture(scope="module")
def suite():
    """The fixture checkout (PEER_FIXTURE) opened as a suite."""
    from suites import open_suite

    with open_suite(f"jaxbench:{PEER_FIXTURE}") as s:
        yield s


@pytest.fixture(scope="module")
def v6e():
    """A grader for v6e, the generation JAXBench was tuned for."""
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu-interpret", workers=1, generation="v6e") as ev:
        yield ev


@pytest.fixture
def cli(capsys):
    """`python -m evaluator ...` in this process (tests/test_cli.py runs the real entry point once
    per command): its exit code, stdout and stderr, as a subprocess would give them."""
    from types import SimpleNamespace

    from cli.main import main

    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()  # drop what came before
        code = main(list(args))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
    return run


SUITE_CACHE_ENV = "PALLAS_KERNEL_GYM_SUITE_CACHE"  # suites.listing.CACHE_ENV (not imported here: jax)
XLA_COSTS_ENV = "PALLAS_KERNEL_GYM_XLA_COSTS"  # evaluator.performance.xla_cost.XlaCostCache's folder


SHARED_CACHE_ENV = "PALLAS_KERNEL_GYM_TEST_CACHE"


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test run that its xdist workers share, for content-keyed caches: under
    $PALLAS_KERNEL_GYM_TEST_CACHE when set (CI sets it, so that the default suite and the slow
    tier after it share one), else in the run's temporary folder. Never the user's ~/.cache."""
    if os.environ.get(SHARED_CACHE_ENV):
        return Path(os.environ[SHARED_CACHE_ENV]) / name
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@pytest.fixture(scope="session")
def shared_verdicts(tmp_path_factory) -> Path:
    """A verdict cache (evaluator/cache.py) for tests that read a grading rather than test one:
    a solution's static verdict is graded once per test run, whichever test asks first. Its keys
    hold the grading code's digest, so a verdict of other code is never read back."""
    return shared_folder(tmp_path_factory, "verdicts")


@pytest.fixture(scope="session", autouse=True)
def xla_cost_cache(tmp_path_factory):
    """Compiled reference costs (evaluator/performance/xla_cost.py) go to the run's shared folder
    (the entries are content-keyed)."""
    folder = shared_folder(tmp_path_factory, "xla-costs")
    before = os.environ.get(XLA_COSTS_ENV)
    os.environ[XLA_COSTS_ENV] = str(folder)
    yield
    if before is None:
        os.environ.pop(XLA_COSTS_ENV, None)
    else:
        os.environ[XLA_COSTS_ENV] = before


@pytest.fixture(scope="session", autouse=True)
def suite_load_cache(tmp_path_factory):
    """Building an imported task records it in a load cache (suites/listing.py): the tests write
    to their own folder (subprocesses inherit it), never to the user's ~/.cache."""
    before = os.environ.get(SUITE_CACHE_ENV)
    os.environ[SUITE_CACHE_ENV] = str(tmp_path_factory.mktemp("suite-loads"))
    yield
    if before is None:
        os.environ.pop(SUITE_CACHE_ENV, None)
    else:
        os.environ[SUITE_CACHE_ENV] = before
