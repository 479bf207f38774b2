"""Bug operators: they apply across the suite, touch only their site, and the evaluator sees the bug."""
import ast
import difflib
from collections import Counter

import pytest

from data_gen.failures.fingerprint import normalized
from data_gen.failures.mutations import mutants
from data_gen.failures.operators import OPERATORS, operator
from data_gen.rows.explanations import explain
from evaluator.record import Verdict
from tasks import all_tasks, get_task

TRAIN_TASKS = [t for t in all_tasks() if not t.heldout_task]
WHOLE_FILE = {"plain_jax", "copy_kernel_shortcut"}


@pytest.fixture(scope="module")
def suite_mutants():
    return {t.name: mutants(t) for t in TRAIN_TASKS}


@pytest.mark.slow
def test_at_least_fifteen_operators_and_each_applies_somewhere(suite_mutants):
    assert len(OPERATORS) >= 15
    used = {m.operator for ms in suite_mutants.values() for m in ms}
    assert used == {op.name for op in OPERATORS}


@pytest.mark.slow
def test_every_train_task_gets_mutants_of_many_kinds(suite_mutants):
    for name, ms in suite_mutants.items():
        assert len({m.operator for m in ms}) >= 8, name


@pytest.mark.slow
def test_mutants_parse_and_change_only_their_site(suite_mutants):
    for name, ms in suite_mutants.items():
        original = normalized(get_task(name).solution_source()).splitlines()
        for m in ms:
            if m.operator == "truncated_answer":
                assert not m.answer().rstrip().endswith("```")
                continue
            if not operator(m.operator).parses:  # a bug in the answer's syntax
                with pytest.raises(SyntaxError):
                    ast.parse(m.source)
                continue
            ast.parse(m.source)
            assert m.source != "\n".join(original)
            if m.operator in WHOLE_FILE:
                continue
            # compared without comments: the comments a bug contradicts are dropped with it
            changed = [line for line in difflib.unified_diff(original, normalized(m.source).splitlines(), n=0,
                                                             lineterm="")
                       if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
            # a rewrite of one site: a statement's lines at most, never the rest of the file
            assert 0 < len(changed) <= 2 * 12, (m.id, changed)


@pytest.mark.slow
def test_block_size_operators_leave_an_operands_whole_extent_alone(suite_mutants):
    """depthwise_conv2d's weights block is (k, k, bc) with k = w.shape[0]: k is the filter, not a
    tile, and k = 2048 made a trace of 2048 x 2048 unrolled taps that ran into the step limit.
    Its channel block stays a site, and so do tile sizes computed from a shape (matmul's)."""
    def edits(task, op):
        return [m.source for m in suite_mutants[task] if m.operator == op]

    assert "    k = w.shape[0]" in get_task("depthwise_conv2d").solution_source()
    assert edits("depthwise_conv2d", "literal_block_size")  # bc
    for op in ("oversized_block", "literal_block_size"):
        assert all("    k = w.shape[0]" in source for source in edits("depthwise_conv2d", op)), op
    assert edits("matmul", "oversized_block")  # bm = _block(m, BLOCK_M, 8)


def test_unknown_operator_names_the_known_ones():
    with pytest.raises(KeyError, match="misaligned_block"):
        operator("no_such_bug")


def _mutant(task: str, op: str, predicate=lambda m: True):
    return next(m for m in mutants(get_task(task)) if m.operator == op and predicate(m))


# (task, operator, the status the evaluator must give): one per error class the pipeline targets
EXPECTED = [
    ("matmul", "misaligned_block", "lowering_error"),
    ("matmul", "drop_accumulator_init", "wrong_output"),
    ("matmul", "interpret_flag", "policy_violation"),
    ("matmul", "hallucinated_import", "import_error"),
    ("matmul", "plain_jax", "no_kernel"),
    ("matmul", "copy_kernel_shortcut", "work_outside_kernel"),
    ("matmul", "wrong_out_dtype", "wrong_shape"),
    ("batched_matmul", "no_parallel_axis", "missing_feature"),
    ("argmax_rows", "python_if_on_traced", "lowering_error"),
    ("matmul", "program_id_branch", "lowering_error"),
    ("matmul", "api_drift", "lowering_error"),
    ("matmul", "block_rank_mismatch", "lowering_error"),
    ("reduce_sum_max", "scalar_store", "lowering_error"),
    ("softmax", "whole_array_block", "compile_error"),
    ("matmul", "unsliced_padding", "wrong_shape"),
    ("attention_fwd", "missing_scale", "wrong_output"),
]


@pytest.mark.parametrize("task,op,status", EXPECTED)
def test_the_evaluator_confirms_the_bug(evaluator, task, op, status):
    m = _mutant(task, op)
    verdict = evaluator.grade(task, m.answer(), "train", seed=0)
    assert verdict.status == status, verdict.message


def test_truncated_answers_fail_at_extraction(evaluator):
    statuses = {evaluator.grade("matmul", m.answer(), "train", seed=0).status
                for m in mutants(get_task("matmul")) if m.operator == "truncated_answer"}
    assert statuses == {"extraction_error"}


def test_explanations_describe_this_kernel_as_observed(evaluator):
    a = _mutant("matmul", "drop_accumulator_init")
    b = _mutant("argmax_rows", "python_if_on_traced")
    va = evaluator.grade("matmul", a.answer(), "train", seed=0)
    vb = evaluator.grade("argmax_rows", b.answer(), "train", seed=0)
    ea, eb = explain(a, va), explain(b, vb)
    assert "matmul_kernel" in ea and "acc_ref" in ea and "_init" not in ea  # the deleted block is not named
    assert b.facts["cond"] in eb and ("bool" in eb or "truth value" in eb)
    assert ea != eb


def test_a_bf16_scratch_that_fails_on_its_store_is_explained_as_a_dtype_error(evaluator):
    bug = _mutant("matmul", "bf16_accumulation", lambda m: m.facts["where"] == "scratch")
    verdict = evaluator.grade("matmul", bug.answer(), "train", seed=0)
    assert verdict.status == "lowering_error"
    text = explain(bug, verdict)
    assert "store" in text and "precision" not in text


def test_a_failure_the_story_does_not_cover_gets_no_explanation():
    bug = _mutant("matmul", "drop_accumulator_init")
    other = Verdict(task="matmul", task_version=2, status="missing_feature", stage="features",
                    message="missing_feature: the task requires vmem_scratch", backend="tpu-interpret", split="train")
    assert explain(bug, other) is None
    shift = _mutant("matmul", "index_map_shift")
    unrelated = Verdict(task="matmul", task_version=2, status="runtime_error", stage="run",
                        message="runtime_error: ZeroDivisionError: division by zero", backend="tpu-interpret",
                        split="train")
    assert explain(shift, unrelated) is None  # a runtime error, but not the out-of-bounds one


@pytest.mark.parametrize("task,op,quoted", [
    ("gemm_bias_gelu", "drop_finalize", "b_ref"),               # the bias is added at the end, not zeros
    ("attention_bwd", "drop_accumulator_init", "dq_acc[...] = jnp.zeros_like(dq_acc)"),
])
def test_init_and_finalize_fixes_quote_the_code_the_repair_has(task, op, quoted):
    bug = _mutant(task, op)
    verdict = Verdict(task=task, task_version=1, status="wrong_output", stage="run",
                      message="wrong_output: wrong values on case c", backend="tpu-interpret", split="train")
    text = explain(bug, verdict)
    assert text is not None and quoted in text
    assert "or -inf" not in text and "(or" not in text


def test_budget_follows_the_target_mix_of_kinds():
    from data_gen.catalogue.kinds import kind_of_operator
    from data_gen.catalogue.mix import target_mix
    from data_gen.sources.mutation import MutationSource

    names = ["matmul", "softmax", "attention_fwd_causal", "layer_norm", "gemm_softmax", "rotary_embedding"]
    chosen = MutationSource([get_task(n) for n in names], 12, seed=0).items()
    compounds = [m for m in chosen if m.parts]
    assert len(chosen) == 12 * len(names) and len(compounds) == len(names)
    kinds = Counter(kind_of_operator(m.operator) for m in chosen if not m.parts)
    target = target_mix()
    for kind, n in kinds.items():  # each kind near its share, as far as the tasks offer it
        assert n / sum(kinds.values()) <= target[kind] + 0.06, kinds
    assert len(kinds) >= 10


def test_mutants_spread_over_the_pool_kernels_and_operators():
    from data_gen.pool import load_pool, pool_variants
    from data_gen.sources.mutation import MutationSource

    variants = pool_variants([e for e in load_pool() if e.task == "matmul"])
    kernels = dict(variants["matmul"])
    assert len(kernels) >= 4
    chosen = MutationSource([get_task("matmul")], 2 * len(kernels), seed=0, variants=variants).items()
    per_kernel = Counter(m.variant for m in chosen)
    assert set(per_kernel) == set(kernels) and max(per_kernel.values()) <= 3  # 2 each, one may host the compound
    assert len({m.operator for m in chosen}) >= len(kernels) + 2
    for m in chosen:  # each mutant is one edit away from the kernel it names, not from the solution
        assert m.source != kernels[m.variant]
        assert (m.variant == "solution") == (m.id.count(":") == 2)


def test_a_run_without_a_budget_takes_what_the_engine_makes():
    """A run makes each mutant only when it takes it; with no budget it takes them all, and what
    it takes is what `mutants` makes in full: no bug that leaves a leftover or breaks the
    syntax, no repeated source."""
    from data_gen.sources.mutation import MutationSource

    for name in ("layer_norm", "grouped_matmul"):
        task = get_task(name)
        made = mutants(task)
        taken = MutationSource([task], 0, seed=0).items()
        assert len(taken) == len(made) and {m.source for m in taken} == {m.source for m in made}


def test_stop_at_first_failure_confirms_a_failure_with_one_case(evaluator):
    bug = _mutant("matmul", "drop_accumulator_init")
    assert evaluator.stop_at_first_failure and evaluator.n_seeds == 1  # tests/conftest.py
    verdict = evaluator.grade("matmul", bug.answer(), "train", seed=0)
    assert verdict.status == "wrong_output" and len(verdict.cases) == 1
    assert len(get_task("matmul").select("train", "check")) > 1


def test_work_items_do_not_depend_on_the_hash_seed():
    """A resumed run must see the same items: nothing may follow a set's (per-process) order."""
    import subprocess
    import sys

    script = ("from data_gen.sources.mutation import MutationSource; from data_gen.pool import load_pool, pool_variants; "
              "from tasks import get_task; names = ['log_softmax', 'softmax']; "
              "v = pool_variants([e for e in load_pool() if e.task in names]); "
              "print([m.id for m in MutationSource([get_task(n) for n in names], 12, 0, variants=v).items()])")
    runs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(runs) == 1
