"""The digest that keys the variant pool, the verdict cache and rebench journals covers what
decides a verdict and nothing else (evaluator/digest.py)."""
import ast

from evaluator.digest import GRADING_ROOTS, code_digest, import_closure, without_docstrings

MODULE = '''"""A module docstring."""


def message(x):
    """What it says."""
    return f"wrong values on case {x}"  # the feedback a model reads
'''


def _key(source: str) -> str:
    return ast.dump(without_docstrings(ast.parse(source)))


def test_docstrings_comments_and_layout_do_not_count_but_code_and_messages_do():
    reworded = MODULE.replace("A module docstring.", "Reworded.").replace("What it says.", "Other words.")
    reformatted = reworded.replace("  # the feedback a model reads", "").replace("(x):", "( x ):")
    assert _key(MODULE) == _key(reworded) == _key(reformatted)
    assert _key(MODULE) != _key(MODULE.replace("wrong values", "bad values"))
    assert _key(MODULE) != _key(MODULE.replace("{x}", "{x!r}"))


def test_the_grading_closure_leaves_out_the_shell_and_what_does_not_grade():
    closure = import_closure(GRADING_ROOTS)
    assert {"evaluator.stages", "evaluator.execution.handlers", "evaluator.truth.compare", "evaluator.candidate.policy"} <= set(closure)
    assert not {m for m in closure if not m.startswith("evaluator")}  # no cli, suites, data_gen
    assert "evaluator.tune" not in closure and "evaluator.candidate.knobs" not in closure
    assert "evaluator.__main__" not in closure


def test_an_adapters_digest_is_its_own_code():
    from suites.oracle import ADAPTER_ROOTS

    closure = import_closure(ADAPTER_ROOTS)
    assert {"suites.jaxbench", "suites.driver", "tasks.spec"} <= set(closure)
    assert "suites.attempts" not in closure and "suites.report" not in closure
    assert code_digest(ADAPTER_ROOTS) != code_digest(GRADING_ROOTS)
