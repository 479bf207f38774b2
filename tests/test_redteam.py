"""The red-team corpus (tests/redteam/): every cheat is rejected, with the right status.

Each file's docstring names the cheat and ends with `task: NAME  expect: STATUS`.
"""
import pytest

from tests.conftest import TESTS, expectation

REDTEAM = sorted((TESTS / "redteam").glob("*.py"))


def _expectation(path):
    found = expectation(path)
    assert found, f"{path.name} has no 'task: ... expect: ...' line"
    return found


def test_corpus_is_large_enough():
    assert len(REDTEAM) >= 30


@pytest.mark.parametrize("path", REDTEAM, ids=[p.stem for p in REDTEAM])
def test_cheat_is_rejected_with_the_right_status(evaluator, path):
    task, expected = _expectation(path)
    verdict = evaluator.grade(task, path.read_text(), split="train")
    assert verdict.status != "correct"
    assert verdict.status == expected, verdict.message
