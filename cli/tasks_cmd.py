"""`tasks`: the task table (--json, --markdown), or with --suite the entries of a peer suite's
checkout (--load builds those the load cache lacks)."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

from rich.markup import escape
from rich.table import Table

from cli.options import UsageError, add_suite_option, console, open_resolver, open_suite_option, resolve_tasks


def add_parser(sub) -> None:
    """Register the subcommand on `sub` (the subparsers of python -m evaluator)."""
    t = sub.add_parser("tasks", help="list the tasks")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.add_argument("--markdown", action="store_true", help="print the suite table as Markdown")
    add_suite_option(t)
    t.add_argument("--load", action="store_true",
                   help="with --suite: build every entry not in the load cache (their code runs in the "
                        "sandbox: minutes for a whole checkout) and cache what it shows; without it, "
                        "entries are listed at once, their loads from the cache")
    t.set_defaults(func=cmd_tasks)


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.suite is None:
        if args.load:
            raise UsageError("--load needs --suite KIND:PATH")
        with open_resolver(None) as ours:
            return _list_tasks(args, resolve_tasks(ours, None))
    with open_suite_option(args.suite) as imported:
        if args.load:
            _load_all(imported)
        return _list_suite(args, imported)


def _load_all(suite) -> None:
    """Build every entry the load cache lacks (this fills it), one line per entry on stderr."""
    from suites import LoadError
    from suites.listing import lookup

    names = suite.names()
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        step = f"[{i:{len(str(len(names)))}}/{len(names)}]"
        t0 = time.perf_counter()
        record = lookup(suite.entry(name))
        how = "cached"
        if record is None:
            with contextlib.suppress(LoadError):
                suite.task(name)
            how = f"{time.perf_counter() - t0:.1f} s"
        record = suite.records.setdefault(name, record)
        why = f": {' '.join(record.why_not.split())[:200]}" if not record.loaded else ""
        print(f"{step} {'loaded' if record.loaded else 'not loaded'}: {name}{why} ({how})", file=sys.stderr)
    print(f"{len(names)} entries in {time.perf_counter() - start:.0f} s", file=sys.stderr)


def _list_suite(args: argparse.Namespace, suite) -> int:
    """Every entry of the checkout, read without running it; loads from the cache (suites/listing.py)."""
    from suites.listing import fill_hint, list_entries, markdown

    rows = list_entries(suite.root, list(suite.entries.values()), known=suite.records)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    elif args.markdown:
        print(markdown(rows))
    else:
        table = Table(title=f"{len(rows)} entries in {suite.root}")
        for col in ("task", "kind", "level", "file", "optimized.py", "status", "signature", "cases (train/heldout)"):
            table.add_column(col, overflow="fold", no_wrap=col == "task")
        for r in rows:
            table.add_row(r.name, r.kind, str(r.level), r.file, "yes" if r.optimized else "-",
                          escape(r.status_text()), escape(r.record.signature if r.record and r.record.signature else "-"),
                          r.cases_text())
        console.print(table)
    hint = fill_hint(args.suite, rows)
    if hint:
        print(hint, file=sys.stderr)
    return 0


def _list_tasks(args: argparse.Namespace, suite: list) -> int:
    if args.json:
        print(json.dumps([t.summary() for t in suite], indent=2))
        return 0
    if args.markdown:
        print("| task | level | computes | signature | required features | shapes from | held-out task |")
        print("|---|---|---|---|---|---|---|")
        for t in suite:
            print(f"| `{t.name}` | {t.level} | {t.description} | `{t.signature}` | "
                  f"{', '.join(f'`{f}`' for f in t.required_features) or '-'} | {t.shapes_from or '-'} | "
                  f"{'yes' if t.heldout_task else '-'} |")
        return 0
    table = Table(title=f"{len(suite)} tasks")
    for col in ("task", "level", "signature", "dtypes", "features", "shapes from", "cases (train/heldout)"):
        table.add_column(col)
    for t in suite:
        s = t.summary()["cases"]
        table.add_row(t.name, str(t.level), escape(t.signature), ", ".join(t.dtypes),
                      ", ".join(t.required_features) or "-", t.shapes_from or "-",
                      f"{s['train/check']}+{s['train/bench']} / {s['heldout/check']}+{s['heldout/bench']}")
    console.print(table)
    console.print("cases: check-size + bench-size; check sizes run, bench sizes are traced and lowered.")
    return 0
