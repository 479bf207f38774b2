"""The stages' declared reads and writes (evaluator/stages.py STAGES) are what their code does,
and a stage that reads what no earlier stage wrote is refused where STAGES is defined."""
import ast
import dataclasses
import inspect
import textwrap

import pytest

from evaluator import stages
from evaluator.stages import STAGES, GradingContext, check_order

# Fields the grader sets before any stage runs are inputs, not a stage's product.
WRITTEN_BY_STAGES = frozenset().union(*(s.writes for s in STAGES))
FUNCTIONS = {name: fn for name, fn in vars(stages).items() if inspect.isfunction(fn) and fn.__module__ == stages.__name__}
PROPERTIES = {name: p for name, p in vars(GradingContext).items() if isinstance(p, property)}


def _parsed(fn) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _accesses(node: ast.AST, seen: set[str]) -> tuple[set[str], set[str]]:
    """Context fields read and written by a function body, through the module's helpers it calls
    and the context's properties it reads."""
    reads, writes = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("ctx", "self"):
            if isinstance(sub.ctx, ast.Store):
                writes.add(sub.attr)
            else:
                reads.add(sub.attr)
                if sub.attr in PROPERTIES and sub.attr not in seen:
                    seen.add(sub.attr)
                    more, _ = _accesses(_parsed(PROPERTIES[sub.attr].fget), seen)
                    reads |= more
        if isinstance(sub, (ast.Assign, ast.AugAssign)):  # ctx.summaries[name] = ... writes summaries
            for target in getattr(sub, "targets", [getattr(sub, "target", None)]):
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                        and isinstance(target.value.value, ast.Name) and target.value.value.id == "ctx"):
                    writes.add(target.value.attr)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in FUNCTIONS:
            if sub.func.id not in seen:
                seen.add(sub.func.id)
                more_r, more_w = _accesses(_parsed(FUNCTIONS[sub.func.id]), seen)
                reads |= more_r
                writes |= more_w
    return reads, writes


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_a_stage_declares_what_its_code_reads_and_writes(stage):
    reads, writes = _accesses(_parsed(stage.run), {stage.run.__name__})
    assert writes & WRITTEN_BY_STAGES == stage.writes
    # what it reads of what stages write; reading back its own write is no dependency
    assert (reads & WRITTEN_BY_STAGES) - (stage.writes - stage.reads) == stage.reads


def test_a_stage_reading_before_any_write_is_refused():
    by_name = {s.name: s for s in STAGES}
    swapped = tuple(by_name[n] for n in ("extract", "policy", "load", "index_maps", "structure"))
    with pytest.raises(TypeError, match="index_maps reads .*summaries.* before any stage writes it"):
        check_order(swapped)
    typo = dataclasses.replace(by_name["run"], reads=frozenset({"coverage_case"}))
    with pytest.raises(TypeError, match="not fields of GradingContext"):
        check_order((*STAGES[:-2], typo))
    check_order(STAGES)  # the real order passes
