"""The failure catalogue: one entry per kind, real texts classified into it, injectors that make
it, and the target mix the dataset is calibrated to."""
from collections import Counter

import pytest

from data_gen.catalogue.kinds import GPT53_FAILURES, KINDS, classify, kind, kind_of_operator, real_mix, total_variation
from data_gen.catalogue.mix import MAX_KIND_SHARE, SEMANTIC_SHARE, TV_LIMIT, mix_table, target_mix
from data_gen.failures.mutations import mutants
from data_gen.failures.operators import INJECTORS, OPERATORS
from data_gen.rows.dataset import calibrate
from tasks import get_task


def test_every_injector_belongs_to_exactly_one_kind():
    assert sorted(op.name for op in OPERATORS) == sorted(op.name for op in INJECTORS)
    listed = [name for k in KINDS for name in k.operators]
    assert len(listed) == len(set(listed))
    assert len({k.name for k in KINDS}) == len(KINDS) >= 15


def test_the_real_counts_add_up_to_gpt53s_failures():
    assert sum(k.gpt53 for k in KINDS) <= GPT53_FAILURES == 129
    assert sum(real_mix().values()) == pytest.approx(1.0)
    assert real_mix()["block_alignment"] == pytest.approx(36 / 129)


# Error texts as jax, Mosaic and our grader word them (written here, not copied from a checkout).
@pytest.mark.parametrize("status,message,expected", [
    ("error", "ValueError: The Pallas TPU lowering currently requires that the last two dimensions of your "
              "block shape are divisible by 8 and 128 respectively", "block_alignment"),
    ("compile_error", "kernel k at case c needs at least 96.0 MiB of VMEM for its pipelined blocks",
     "vmem_exhaustion"),
    ("error", "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating", "vmem_exhaustion"),
    ("error", "TracerBoolConversionError: Attempted boolean conversion of traced array with shape bool[]",
     "traced_bool"),
    ("error", "IndexError: Array slice indices must have static start/stop/step to be used", "traced_index"),
    ("error", "NotImplementedError: Unimplemented primitive in Pallas TPU lowering for KernelType.TC: argmax",
     "unsupported_op"),
    ("error", "`broadcast_to` is a Triton-specific primitive. Please consider using `jnp.broadcast_to` instead.",
     "triton_primitive"),
    ("error", "Block shape for args[0] must have the same number of dimensions as the array shape (4, 8, 128)",
     "block_rank"),
    ("error", "Pytree for `in_specs` and `inputs` do not match: length 2 vs 3", "spec_arity"),
    ("error", "The kernel function in the pallas_call k captures constants [f32[]]", "captured_constant"),
    ("error", "TypeError: BlockSpec.__init__() got an unexpected keyword argument 'block_size'", "api_misuse"),
    ("error", "Invalid dtype for `swap`. Ref dtype: bfloat16. Value dtype: float32.", "ref_store_mismatch"),
    ("error", "TypeError: mul got incompatible shapes for broadcasting: (8, 128), (8,)", "shape_error"),
    ("import_error", "NameError: name 'jnp' is not defined", "undefined_name"),
    ("import_error", "NameError: the module does not define a callable `kernel`", "wrong_entry_point"),
    ("syntax_error", "the code does not parse: line 3: invalid syntax", "prose_in_code"),
    ("wrong_output", "wrong values on case c: 40% of elements outside tolerance", "wrong_values"),
    ("runtime_error", "Out-of-bounds read of block 4 of x", "out_of_bounds"),
    ("error", "AssertionError", "other"),
])
def test_error_texts_classify_to_their_kind(status, message, expected):
    assert classify(status, message) == expected


def test_target_mix_caps_every_kind_and_keeps_the_runtime_share():
    target = target_mix()
    assert sum(target.values()) == pytest.approx(1.0)
    assert max(target.values()) <= MAX_KIND_SHARE + 1e-9
    assert sum(v for k, v in target.items() if kind(k).semantic) == pytest.approx(SEMANTIC_SHARE)
    assert all(kind(k).operators for k in target)  # nothing is asked of a kind no operator injects
    assert total_variation(target, {k: v for k, v in real_mix().items()}) < 0.5


def _rows(counts: dict[str, int]) -> list[dict]:
    return [{"kind": k, "task": f"t{i % 7}"} for k, n in counts.items() for i in range(n)]


def test_calibrate_trims_to_the_real_mix_within_the_limit():
    plenty = {name: 200 for name in target_mix()}
    kept = calibrate(_rows(plenty), kind_of=lambda r: r["kind"], spread=lambda r: r["task"])
    counts = Counter(r["kind"] for r in kept)
    assert len(kept) > 1000 and max(counts.values()) <= MAX_KIND_SHARE * len(kept)
    from data_gen.catalogue.kinds import mix_of

    assert total_variation(mix_of(counts), real_mix()) <= TV_LIMIT
    assert "**" in mix_table(counts) and "Total variation" in mix_table(counts)


def test_calibrate_keeps_what_it_can_when_the_limit_is_out_of_reach():
    few = {"wrong_values": 30, "block_alignment": 2}
    kept = calibrate(_rows(few), kind_of=lambda r: r["kind"], spread=lambda r: r["task"])
    counts = Counter(r["kind"] for r in kept)
    assert counts["block_alignment"] == 2 and 0 < counts["wrong_values"] < 30


def test_a_trimmed_kind_keeps_the_tasks_with_the_fewest_rows_first():
    """Trimmed over (task, structure) groups in order, the kind would keep the first tasks'
    structures and lose the last task (rg_lru's fate once): every task comes before a second
    structure of any, the task with the fewest rows first."""
    rows = [{"kind": "wrong_values", "task": f"t{t}", "structure": s} for t in range(3) for s in range(8)]
    rows += [{"kind": "wrong_values", "task": "rare", "structure": 0}]
    rows += [{"kind": "block_alignment", "task": "t0", "structure": 0}] * 2
    kept = calibrate(rows, kind_of=lambda r: r["kind"], spread=lambda r: (r["task"], r["structure"]))
    wrong = [r["task"] for r in kept if r["kind"] == "wrong_values"]
    assert 4 <= len(wrong) < 25
    assert set(wrong) == {"t0", "t1", "t2", "rare"}


NEW_INJECTORS = ["literal_block_size", "oversized_block", "traced_slice", "traced_value_slice", "missing_in_spec",
                 "captured_constant", "dropped_keepdims", "transposed_operand", "triton_primitive", "missing_import",
                 "wrong_entry_point", "prose_in_code"]


def test_new_injectors_fail_as_their_kind(evaluator):
    from data_gen.sources.grading import SeededGrading
    from data_gen.sources.mutation import first_failure

    grader, found = SeededGrading(evaluator, run_seed=0), {}
    for task in (get_task("softmax"), get_task("attention_fwd")):
        for m in mutants(task):
            if m.operator in NEW_INJECTORS and (task.name, m.operator) not in found:
                _, verdict = first_failure(task, m, grader)
                found[task.name, m.operator] = classify(verdict.status, verdict.message)
    matching = [key for key, k in found.items() if k == kind_of_operator(key[1])]
    assert {op for _, op in found} == set(NEW_INJECTORS) and len(matching) >= 0.8 * len(found), found


def test_a_checkout_is_counted_by_kind(tmp_path, capsys):
    """A JAXBench-shaped results file (texts written here) counted the way the committed facts were."""
    import json

    from data_gen.catalogue.checkout import main

    results = tmp_path / "pallas_eval" / "results"
    results.mkdir(parents=True)
    records = [
        {"level": 1, "name": "a", "status": "error",
         "error": "The Pallas TPU lowering currently requires that the last two dimensions of your block shape "
                  "are divisible by 8 and 128 respectively"},
        {"level": 1, "name": "b", "status": "success", "correct": False, "correctness_reason": "max_diff 3.2"},
        {"level": 1, "name": "c", "status": "success", "correct": True},
        {"level": 2, "name": "d", "status": "error", "error": "ERROR: Command timed out"},  # their infrastructure
        {"level": 2, "name": "e", "status": "error", "error": "AssertionError"},
    ]
    (results / "eval_gpt53.json").write_text(json.dumps({"results": records}))
    assert main([f"jaxbench:{tmp_path}", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert counted["counts"] == {"block_alignment": 1, "wrong_values": 1, "other": 1}
    assert main([f"jaxbench:{tmp_path}", "--model", "nobody"]) == 2
    assert main(["kernelbench:/x"]) == 2
    assert capsys.readouterr().err.count("error:") == 2
