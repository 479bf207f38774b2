"""`collect --source jaxbench:PATH`: a checkout's generated kernels, graded, repaired by the
catalogue's repairers and kept as pairs only when the repair is graded correct.

The fixture checkout (tests/peer_suites/jaxbench) holds, for model beta, a truncated answer, an
answer our policy refuses and one whose task does not load; for model gamma, a softmax with two
bugs of a model (`jnp` never imported, a column block of 2000) that also leaves a ragged grid.
"""
import json

import datasets

from data_gen.collect import main
from tests.conftest import PEER_FIXTURE


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
    assert "write `grid = (pl.cdiv(b, rows), pl.cdiv(d, cols))` in place of `grid = (b // rows, d // cols)`" \
        in explanation[2]
    assert "`ROWS, COLS, LANES = 256, 2048, 128` in place of `ROWS, COLS, LANES = 256, 2000, 128`" in explanation[3]

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


def test_unknown_models_and_checkouts_are_one_line(tmp_path, capsys):
    out = ["--out-dir", str(tmp_path), "--runs-dir", str(tmp_path)]
    assert main(["--source", f"jaxbench:{PEER_FIXTURE}", "--models", "nobody", *out]) == 2
    assert main(["--source", f"jaxbench:{tmp_path / 'nowhere'}", *out]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "nobody" in errors[0] and "alpha, beta, gamma" in errors[0]
    assert "not found" in errors[1]
