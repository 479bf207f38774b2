"""Giveaways: a failing kernel and its repair differ in the fix and nothing else."""
import ast

import pytest

from data_gen.failures.giveaways import dataset_giveaways, masked_edit, row_giveaways, structure
from data_gen.failures.mutations import mutants
from tasks import all_tasks, get_task

REPAIR = '''"""Row sums."""
import jax.numpy as jnp


def k(x_ref, o_ref):
    # one row block per step
    mask = x_ref[...] > 0
    o_ref[...] = jnp.sum(jnp.where(mask, x_ref[...], 0.0), axis=-1, keepdims=True)  # masked sum
'''


def test_a_pair_that_differs_only_in_the_fix_breaks_no_rule():
    failing = REPAIR.replace("axis=-1, keepdims=True)  # masked sum", "axis=-1)")
    assert row_giveaways(failing, REPAIR) == []


@pytest.mark.parametrize("failing,rule", [
    (REPAIR.replace('"""Row sums."""\n', ""), "annotation_differs"),          # docstring on one side only
    (REPAIR.replace("    # one row block per step\n", ""), "annotation_differs"),  # a comment away from the fix
    (REPAIR.replace("jnp.where(mask, x_ref[...], 0.0)", "x_ref[...]"), "dead_name"),  # `mask` left unread
    (REPAIR.replace("    mask = x_ref[...] > 0\n", "    mask = x_ref[...] > 0\n    x = x\n"), "self_assignment"),
])
def test_each_row_rule_catches_its_giveaway(failing, rule):
    assert rule in row_giveaways(failing, REPAIR)


def test_edits_and_structures_mask_numbers():
    a, b = REPAIR.replace("0.0", "1.0"), REPAIR.replace("0.0", "2.0")
    assert masked_edit(a, REPAIR) == masked_edit(b, REPAIR) != ""
    assert structure(REPAIR.replace("0.0", "0.5")) == structure(REPAIR)
    assert structure(REPAIR.replace("jnp.sum", "jnp.max")) != structure(REPAIR)


def test_dataset_rules_count_rows_over_the_caps():
    rows = [{"task": "t", "kind": "a", "failing_code": REPAIR.replace("0.0", str(i)), "repair_code": REPAIR}
            for i in range(5)]
    found = dataset_giveaways(rows, lambda r: r["kind"], max_share=0.5)
    assert found == {"kind_over_cap": 3, "repeated_edit": 3}


@pytest.mark.slow
def test_no_mutant_of_any_solution_leaves_a_giveaway():
    """The mutation engine removes what a bug leaves unread and never writes `x = x`."""
    broken = []
    for task in (t for t in all_tasks() if not t.heldout_task):
        source = task.solution_source()
        broken += [(m.id, rule) for m in mutants(task) for rule in row_giveaways(m.code, source)]
    assert broken == []


def test_a_dropped_mask_takes_its_unread_condition_with_it():
    task = get_task("grouped_matmul")
    drops = [m for m in mutants(task) if m.operator == "drop_mask"]
    assert drops
    for m in drops:
        tree = ast.parse(m.code)
        assigned = [n.targets[0].id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and isinstance(n.targets[0], ast.Name)]
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert m.facts["cond"].split("(")[0] not in set(assigned) - read
