"""Check what the README's main command built: rows, error classes, repair diversity and
structures, the text and giveaway rules, the mix of failure kinds beside the real one, card and
figure.

    python .ci/check_dataset.py datasets/fixit-mutation [--min-rows 300] [--min-classes 10]
                                [--min-repairs 150] [--min-structures 120] [--max-per-repair 3]
                                [--max-opening-share 0.1] [--min-runtime-share 0.15]

Run by .ci/run after it deleted the committed copy, so only a dataset built in this run can pass.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from data_gen.catalogue.kinds import mix_of, real_mix, total_variation
from data_gen.failures.fingerprint import fingerprint
from data_gen.failures.giveaways import dataset_giveaways, row_giveaways, structure
from data_gen.catalogue.mix import MAX_KIND_SHARE, TV_LIMIT, semantic_share
from data_gen.rows.text_rules import opening_share, prose, row_violations


def check(folder: Path, min_rows: int, min_classes: int, min_repairs: int, max_per_repair: int,
          max_opening_share: float = 0.1, min_runtime_share: float = 0.15, min_structures: int = 120) -> list[str]:
    """Problems found; empty when the dataset is whole."""
    problems = []
    for name in ("README.md", "error_classes.png"):
        if not (folder / name).is_file():
            problems.append(f"{folder / name} was not written")
    files = sorted((folder / "data").glob("*.parquet"))
    if not files:
        return problems + [f"no parquet files under {folder / 'data'}"]
    rows = pd.concat([pd.read_parquet(f) for f in files])
    classes = rows["error_class"].value_counts()
    print(f"{folder}: {len(rows)} rows in {len(files)} files, {len(classes)} error classes: "
          + ", ".join(f"{c} {n}" for c, n in classes.items()))
    if len(rows) < min_rows:
        problems.append(f"{len(rows)} rows, expected at least {min_rows}")
    if len(classes) < min_classes:
        problems.append(f"{len(classes)} error classes, expected at least {min_classes}")
    per_repair = (rows["task"] + ":" + rows["repair_code"].map(fingerprint)).value_counts()
    print(f"{len(per_repair)} distinct repair kernels, at most {per_repair.max()} pairs each")
    if len(per_repair) < min_repairs:
        problems.append(f"{len(per_repair)} distinct repair kernels, expected at least {min_repairs}")
    if per_repair.max() > max_per_repair:
        problems.append(f"a repair kernel is behind {per_repair.max()} pairs, expected at most {max_per_repair}")
    if rows["messages"].map(len).ne(5).any():
        problems.append("some rows do not have five messages")
        return problems
    records = rows.to_dict("records")
    broken = [(r["id"], rule) for r in records for rule in row_violations(r)]
    if broken:
        problems.append(f"{len(broken)} text-rule violations, e.g. {broken[:3]}")
    top, share = opening_share(prose(r["messages"][4]["content"]) for r in records)
    print(f"most common explanation opening: {top!r} in {100 * share:.1f}% of rows")
    if share > max_opening_share:
        problems.append(f"{100 * share:.1f}% of explanations open with {top!r}, expected at most "
                        f"{100 * max_opening_share:.0f}%")
    kinds = Counter(rows["failure_kind"])
    runtime = semantic_share(kinds)
    print(f"{100 * runtime:.1f}% of pairs in the runtime kinds")
    if runtime < min_runtime_share:
        problems.append(f"{100 * runtime:.1f}% of pairs in runtime kinds, expected at least "
                        f"{100 * min_runtime_share:.0f}%")
    tv = total_variation(mix_of(kinds), real_mix())
    print(f"total variation from GPT-5.3's real mix: {tv:.3f}")
    if tv > TV_LIMIT:
        problems.append(f"the mix of failure kinds is {tv:.3f} from the real one, expected at most {TV_LIMIT}")
    structures = {(r["task"], structure(r["repair_code"])) for r in records}
    print(f"{len(structures)} distinct repair structures")
    if len(structures) < min_structures:
        problems.append(f"{len(structures)} repair structures, expected at least {min_structures}")
    given = [(r["id"], rule) for r in records for rule in row_giveaways(r["failing_code"], r["repair_code"])]
    given += [(rule, n) for rule, n in dataset_giveaways(records, lambda r: r["failure_kind"], MAX_KIND_SHARE).items()
              if n]
    if given:
        problems.append(f"{len(given)} giveaways, e.g. {given[:3]}")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--min-rows", type=int, default=300)
    p.add_argument("--min-classes", type=int, default=10)
    p.add_argument("--min-repairs", type=int, default=150)
    p.add_argument("--max-per-repair", type=int, default=3)
    p.add_argument("--max-opening-share", type=float, default=0.1)
    p.add_argument("--min-runtime-share", type=float, default=0.15)
    p.add_argument("--min-structures", type=int, default=120)
    args = p.parse_args()
    problems = check(args.folder, args.min_rows, args.min_classes, args.min_repairs, args.max_per_repair,
                     args.max_opening_share, args.min_runtime_share, args.min_structures)
    for problem in problems:
        print(f"check_dataset: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
