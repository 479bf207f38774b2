import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PALLAS_EVAL_ASSUME_NO_TPU", "1")  # tests pin the tpu-interpret backend
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # with libtpu installed, jax would probe for a TPU

TESTS = Path(__file__).parent
CANDIDATES = TESTS / "candidates"
HONEST = TESTS / "honest"


def read_candidate(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


@pytest.fixture(scope="session")
def evaluator():
    """One warm evaluator for the whole session: workers are reused across tests."""
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu-interpret", workers=1) as ev:
        yield ev


@pytest.fixture(scope="session")
def quick_timeout_evaluator():
    """Short step limit, for the candidates that hang."""
    from evaluator.grader import Evaluator
    from evaluator.sandbox import Limits

    with Evaluator(backend="tpu-interpret", workers=1, limits=Limits(step_timeout_s=8)) as ev:
        yield ev
