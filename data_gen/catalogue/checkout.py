"""A JAXBench checkout's real failures, counted by failure kind with the catalogue's own
`classify`, so the real mix and ours share one vocabulary: `python -m data_gen.catalogue
jaxbench:PATH` (`__main__.py` launches `main`)."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from data_gen.catalogue.kinds import REAL_MODEL, UNCLASSIFIED, classify


def count_checkout(root: Path, model: str) -> tuple[Counter, list[tuple[str, str]]]:
    """Classify one model's real failures in a JAXBench checkout: counts by kind and, for the
    unclassified, (name, first line) so the patterns can be checked by reading."""
    from suites.attempts import classify as their_verdict, read_results, their_error

    records = read_results(root, model)
    if not records:
        raise FileNotFoundError(f"no results for model {model!r} under {root} (pallas_eval/results/eval_{model}.json)")
    counts: Counter[str] = Counter()
    unclassified = []
    for (_, name), record in sorted(records.items()):
        theirs = their_verdict(record)
        if theirs.verdict != "failed":
            continue
        status = "wrong_output" if theirs.status == "success" else "error"
        text = their_error(record) if status == "error" else ""
        found = classify(status, text)
        counts[found] += 1
        if found == UNCLASSIFIED:
            unclassified.append((name, text.splitlines()[0][:120] if text else ""))
    return counts, unclassified


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_gen.catalogue",
                                description="Count a JAXBench checkout's real failures by kind.")
    p.add_argument("source", help="jaxbench:PATH, a JAXBench checkout")
    p.add_argument("--model", default=REAL_MODEL, help="model folder under pallas_eval/generated")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    kind_, _, path = args.source.partition(":")
    if kind_ != "jaxbench" or not path:
        print(f"error: expected jaxbench:PATH, got {args.source!r}", file=sys.stderr)
        return 2
    try:
        counts, unclassified = count_checkout(Path(path), args.model)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": args.model, "counts": dict(counts), "unclassified": unclassified}))
        return 0
    total = sum(counts.values())
    print(f"{args.model}: {total} kernel failures")
    for name, n in counts.most_common():
        print(f"  {name:20s} {n:4d}  {100 * n / total:5.1f}%")
    for name, line in unclassified:
        print(f"  unclassified: {name}: {line}")
    return 0
