"""`collect --source jaxbench:PATH`: a checkout's generated kernels, graded, repaired by the
catalogue's repairers and kept as pairs only when the repair is graded correct.

The fixture checkout (tests/peer_suites/jaxbench) holds, for model beta, a truncated answer, an
answer our policy refuses and one whose task does not load; for model gamma, a softmax with two
bugs of a model (`jnp` never imported, a column block of 2000) that also leaves a ragged grid.
"""
import json

import datasets
import pytest
from data_gen.collect import main
from tests.conftest import PEER_FIXTURE


@pytest.mark.slow
def test_a_checkout_gives_verified_pairs_and_counts_what_it_cannot_repair(tmp_path, capsys):
    from data_gen.regrade import main as regrade

    code = main(["--source", f"jaxbench:{PEER_FIXTURE}", "--models", "beta", "gamma", "--workers", "1",
                 "--out-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs"), "--validation-fraction", "0"])
    assert code == 0
    folder = tmp_path / "fixit-jaxbench"
    rows = list(datasets.load_dataset(str(folder), split="train"))
    assert len(rows) == 1
    row = rows[0]
    assert (row["source"], row["origin"], row["failure_kind"]) == ("jaxbench", "gamma", "undefined_name")
    assert row["repaired_by"] == "search: undefined_name + wrong_values + block_alignment"
    # the explanation names each applied edit, in order, and nothing else
    explanation = row["messages"][4]["content"].split("```")[0].strip().splitlines()
    assert explanation[0].startswith("3 fixes") and len(explanation) == 4
    assert explanation[1].endswith("Fix: add `import jax.numpy as jnp`.")
    assert explanation[2].startswith("2. The grid counts whole blocks only: `b // rows`, `d // cols` (line 38) round "
                                     "down, so where a size is not a multiple of its block the last, partial block")
    assert "Fix: `pl.cdiv(b, rows)`, `pl.cdiv(d, cols)` blocks" in explanation[2]
    assert explanation[3].startswith("3. A block size off TPU's tiling: on TPU the last two dims of a block must be")
    assert explanation[3].endswith("so Mosaic refuses to lower the kernel. Fix: round 2000 (line 10) up to 2048, a "
                                   "multiple of 128.")

    # re-graded from scratch, on other seeds: the failing kernel fails, its repair passes every train case
    assert regrade([str(folder), "--suite", f"jaxbench:{PEER_FIXTURE}", "--workers", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith("1 of 1 pairs re-grade as (fails, passes)")

    entries = [json.loads(line) for line in (tmp_path / "runs" / "fixit-jaxbench" / "journal.jsonl").open()]
    reasons = sorted(e["drop_reason"] or "" for e in entries if e.get("kind") == "attempt")
    assert reasons == ["", "not repaired", "task not loaded", "truncated"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: other\n")
    assert "carry no licence" in card and "commit unknown: not a git checkout" in card and "beta, gamma" in card
    assert "| undefined_name | 1 | 0 | 1 | 1 |" in card and "| prose_in_code | 1 | 1 | 0 | 0 |" in card
    assert "| search: undefined_name + wrong_values + block_alignment | 1 |" in card
    # the truncated answer's length against the 16384 output tokens the fixture's generate.py allowed
    assert "Answers cut off mid-code: 1, stopping after a median of" in card
    assert "allowed 16,384 output tokens: 0 of the 1 reach 80% of that" in card
    # the kept pair shown: its explanation, then its diff
    example = card.split("## Explanations\n", 1)[1]
    assert "### kernelbench-jax/level1/23_Softmax (search: undefined_name + wrong_values + block_alignment)" in example
    assert "> 3 fixes" in example and "+import jax.numpy as jnp" in example and "```diff" in example


def test_unknown_models_and_checkouts_are_one_line(tmp_path, capsys):
    out = ["--out-dir", str(tmp_path), "--runs-dir", str(tmp_path)]
    assert main(["--source", f"jaxbench:{PEER_FIXTURE}", "--models", "nobody", *out]) == 2
    assert main(["--source", f"jaxbench:{tmp_path / 'nowhere'}", *out]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "nobody" in errors[0] and "alpha, beta, gamma" in errors[0]
    assert "not found" in errors[1]


def _row(repaired_by: str, changed_lines: int, name: str) -> dict:
    failing = "\n".join(f"a{i} = {i}" for i in range(10))
    repair = "\n".join(f"a{i} = {i + (i < changed_lines)}" for i in range(10))
    return {"id": name, "task": f"t/{name}", "repaired_by": repaired_by, "failing_code": failing,
            "repair_code": repair, "messages": [{"content": f"Fix {name}.\n\n```python\n{repair}\n```"}]}


def test_the_card_shows_different_repairs_and_measures_the_cut_off_answers():
    from data_gen.sources.replay import Yield, example_section, examples

    both = "search: work_outside + wrong_values"
    kept = [_row(both, 3, "big"), _row(both, 1, "small"), _row("search: work_outside", 1, "same_repairer"),
            _row("search: api_misuse", 2, "other")]
    shown = examples(kept)
    # the smallest of the commonest label, then the commonest label with no repairer in common
    assert [r["id"] for r in shown] == ["small", "other"]
    section = example_section(shown)
    assert section.startswith("\n## Two explanations\n") and "> Fix small." in section
    assert "-a0 = 0\n+a0 = 1" in section and "```python" not in section

    measured = Yield(cut_off_chars=[2_000, 1_500, 60_000], answer_limit=16_384).cut_off_text()
    assert measured.startswith("Answers cut off mid-code: 3, stopping after a median of 2,000 characters")
    assert "allowed 16,384 output tokens: 1 of the 3 reach 80% of that" in measured and "; 2 stop short" in measured
    assert "Their request" not in Yield(cut_off_chars=[2_000]).cut_off_text()
    assert Yield().cut_off_text() == ""
