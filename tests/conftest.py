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


@pytest.fixture(scope="session", autouse=True)
def xla_cost_cache(tmp_path_factory):
    """Compiled reference costs (evaluator/performance/xla_cost.py) go to a folder of this test
    run, shared by its xdist workers (the entries are content-keyed), never the user's ~/.cache."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "xla-costs"
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
