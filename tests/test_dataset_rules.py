"""The text of Fixit rows: the rules every explanation obeys, feedback without machine details,
failing kernels that read like a model's, and the committed dataset held to all of it."""
import ast
import glob
from collections import Counter

import pandas as pd
import pytest

from chat.prompts import feedback, machine_free
from data_gen.catalogue.mix import semantic_share
from data_gen.failures.fingerprint import normalized
from data_gen.failures.mutations import compounds, mutants
from data_gen.failures.operators import OPERATORS, round_block
from data_gen.rows.pairs import verdict_json
from data_gen.rows.text_rules import opening, opening_share, prose, row_violations, unknown_names, violations
from evaluator.record import Verdict
from tasks import get_task
from tests.conftest import ROOT

KERNEL = "def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):\n    acc_ref[...] += x_ref[...]\n"


@pytest.mark.parametrize("explanation,rule", [
    ("The kernel fails in the `lowering` stage because `acc_ref` is bf16.", "stage_name"),
    ("The block size 1024 became 1000, so lowering fails.", "history_verb"),
    ("The `_init` block was removed, so `acc_ref` starts from garbage.", "history_verb"),
    ("`acc_ref` is no longer reset.", "history_verb"),
    ("Reset `acc_ref` in `_init_accumulator` at the first step.", "unknown_name"),
    ("See /work/main/.venv/lib/python3.11/site-packages/jax/_src/x.py.", "local_path"),
    ("It fails on seed 123456 only.", "seed"),
    ("Set `acc_ref` to zeros (or -inf for a running max).", "hedge"),
    ("The mask might be off by one.", "hedge"),
])
def test_each_rule_catches_its_breach(explanation, rule):
    assert rule in violations("The evaluator rejected this kernel.", explanation, KERNEL)


def test_a_plain_present_tense_explanation_breaks_no_rule():
    text = ("`matmul_kernel` adds into `acc_ref` on every step but never zeroes it at the first step, so "
            "the sums start from stale VMEM. Add a `@pl.when(pl.program_id(2) == 0)` block that sets "
            "`acc_ref[...] = jnp.zeros_like(acc_ref)`.")
    assert violations("wrong_output: wrong values on case c (m=8): 100% of elements outside tolerance", text,
                      KERNEL) == []


def test_eight_words_copied_from_the_feedback_count_as_a_copy():
    said = "lowering_error: Mosaic rejects the block because its last dim is not a multiple of 128."
    copied = "Mosaic rejects the block because its last dim is not a multiple of 128, so use 256."
    own = "The last block dim must be a multiple of 128 lanes; use 256."
    assert "copied_feedback" in violations(said, copied, KERNEL)
    assert "copied_feedback" not in violations(said, own, KERNEL)


def test_library_names_case_sizes_and_api_keywords_are_not_unknown_names():
    text = ("`jnp.where(mask, s, -jnp.inf)` at `b=2, s=300, float32`; pass `compiler_params=` and "
            "`pltpu.VMEM((8, 128), jnp.float32)`.")
    assert unknown_names(text, "def k(s_ref, mask):\n    s = s_ref[...]\n") == []
    assert unknown_names("call `_helper(x)`", "def k(x):\n    pass\n") == ["_helper"]


def test_openings_mask_code_and_numbers():
    a = opening("`BLOCK_M = 1000` sets a block dimension of 1000, which is not aligned")
    b = opening("`TILE = 250` sets a block dimension of 250, which is not aligned")
    assert a == b
    assert opening_share(["x y", "x y", "z"]) == ("x y", pytest.approx(2 / 3))


def test_feedback_has_no_local_paths_or_seeds_and_the_verdict_keeps_them():
    message = ("import_error: cannot import name 'tpu_ops' from 'jax.experimental.pallas' "
               "(/home/u/proj/.venv/lib/python3.11/site-packages/jax/experimental/pallas/__init__.py); "
               "wrong values on case c (m=8), seed 856999647: 3 of 4 cases failed")
    verdict = Verdict(task="matmul", task_version=1, status="import_error", stage="load", message=message,
                      backend="tpu-interpret", split="train")
    text = feedback(verdict)
    assert "(jax/experimental/pallas/__init__.py)" in text
    assert "site-packages" not in text and "/home/u" not in text and "856999647" not in text
    assert "856999647" in verdict_json(verdict) and "site-packages" in verdict_json(verdict)
    assert machine_free('File "/tmp/abc/candidate.py", line 3, ratio 1/2') == 'File "candidate.py", line 3, ratio 1/2'


# --- failing kernels that read like a model's ----------------------------------------------------

@pytest.fixture(scope="module")
def matmul_mutants():
    return mutants(get_task("matmul"))


def _one(ms, op, predicate=lambda m: True):
    return next(m for m in ms if m.operator == op and predicate(m))


def test_block_sizes_are_round_numbers_a_person_picks():
    assert [round_block(v) for v in (256, 512, 1024, 2048)] == [250, 500, 1100, 2100]
    for v in range(128, 4097, 128):  # near the right size, round, and fits neither tile dim
        new = round_block(v)
        assert new % 8 and new % 50 == 0 and abs(new - v) <= 0.2 * v


def test_vmem_bugs_start_just_over_and_grow_only_when_needed(matmul_mutants):
    bug = _one(matmul_mutants, "vmem_overallocation")
    sizes = [int(m.facts["value"]) for m in (bug, *bug.fallbacks)]
    good = int(bug.facts["good"])
    assert sizes == [2 * good, 4 * good, 8 * good]


def test_comments_and_docstrings_stay_on_both_sides(matmul_mutants):
    """Only a comment on the edited line goes with the bug: a docstring or a comment elsewhere
    missing from the failing kernel alone would be a giveaway."""
    source = get_task("matmul").solution_source()
    docstring = ast.get_docstring(ast.parse(source))
    for m in matmul_mutants:
        if m.operator not in ("plain_jax", "copy_kernel_shortcut", "truncated_answer", "prose_in_code"):
            assert ast.get_docstring(ast.parse(m.code)) == docstring, m.id
            assert "# Zero padding is exact for a matmul" in m.source, m.id


def test_edits_keep_the_formatting(matmul_mutants):
    """Only the site's lines change (comments aside): no call rewritten on one line, no gaps."""
    source = get_task("matmul").solution_source()
    for m in matmul_mutants:
        if m.operator in ("plain_jax", "copy_kernel_shortcut", "truncated_answer"):
            continue
        assert "\n\n\n\n" not in m.source, m.id
        assert max(map(len, m.source.splitlines())) <= max(map(len, source.splitlines())) + 40, m.id
    flag = _one(matmul_mutants, "interpret_flag")
    assert "        interpret=True,\n" in flag.source


def test_truncations_stop_mid_line_with_the_fence_open(matmul_mutants):
    for m in (m for m in matmul_mutants if m.operator == "truncated_answer"):
        answer = m.answer()
        assert answer.startswith("```python") and answer.count("```") == 1
        last = answer.rstrip().splitlines()[-1]
        assert last.strip() == m.facts["last"] and len(last.strip()) > 3


def test_compound_bugs_combine_a_static_bug_with_a_runtime_one():
    task = get_task("matmul")
    combos = compounds(task, task.solution_source())
    assert combos
    family = {op.name: op.family for op in OPERATORS}
    for c in combos[:20]:
        first, second = c.parts
        assert family[first.operator] == "static" and family[second.operator] == "semantic"
        assert normalized(c.source) != normalized(first.source) != normalized(second.source)
        ast.parse(c.source)


# --- the committed dataset ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def committed():
    files = glob.glob(str(ROOT / "datasets" / "fixit-mutation" / "data" / "*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files]).to_dict("records")


def test_committed_rows_break_no_text_rule(committed):
    broken = [(r["id"], row_violations(r)) for r in committed if row_violations(r)]
    assert broken == []


def test_committed_explanations_do_not_share_an_opening(committed):
    top, share = opening_share(prose(r["messages"][4]["content"]) for r in committed)
    assert share <= 0.10, top


def test_committed_mix_is_near_the_real_one(committed):
    from data_gen.catalogue.kinds import mix_of, real_mix, total_variation
    from data_gen.catalogue.mix import MAX_KIND_SHARE, TV_LIMIT

    kinds = Counter(r["failure_kind"] for r in committed)
    assert total_variation(mix_of(kinds), real_mix()) <= TV_LIMIT
    assert max(kinds.values()) <= MAX_KIND_SHARE * len(committed)
    assert 0.15 <= semantic_share(kinds) <= 0.3  # the runtime kinds keep the share data_gen/catalogue/mix.py defends
    assert len(committed) >= 300 and len({r["error_class"] for r in committed}) >= 10
    assert Counter(r["origin"] for r in committed)["compound"] > 0


def test_committed_rows_have_no_giveaway(committed):
    from data_gen.catalogue.mix import MAX_KIND_SHARE
    from data_gen.failures.giveaways import dataset_giveaways, row_giveaways

    assert [(r["id"], row_giveaways(r["failing_code"], r["repair_code"])) for r in committed
            if row_giveaways(r["failing_code"], r["repair_code"])] == []
    assert dataset_giveaways(committed, lambda r: r["failure_kind"], MAX_KIND_SHARE) == {
        "kind_over_cap": 0, "repeated_edit": 0}


def test_committed_repairs_have_many_structures_and_validation_holds_unseen_kinds():
    from data_gen.failures.giveaways import structure
    from data_gen.rows.dataset import VALIDATION_KINDS

    splits = {split: [r for f in glob.glob(str(ROOT / "datasets" / "fixit-mutation" / "data" / f"{split}-*.parquet"))
                      for r in pd.read_parquet(f).to_dict("records")] for split in ("train", "validation")}
    rows = splits["train"] + splits["validation"]
    assert len({(r["task"], structure(r["repair_code"])) for r in rows}) >= 120
    assert not {r["failure_kind"] for r in splits["train"]} & set(VALIDATION_KINDS)
    assert {r["failure_kind"] for r in splits["validation"]} & set(VALIDATION_KINDS)


def test_committed_compound_pairs_explain_both_bugs(committed):
    compound = [r for r in committed if r["origin"] == "compound"]
    assert compound
    for row in compound:
        explanation = row["messages"][4]["content"].split("```")[0]
        first, second = explanation.strip().split("\n\n")  # the bug observed, then the one behind it
        assert row["error_class"] in ("lowering_error", "compile_error", "import_error", "missing_feature")
        assert first and second
