"""`calibrate`: refit the speed prediction's constants from timings measured on a TPU.

On a TPU host, `python -m evaluator run --backend tpu --json ...` (or check-solutions --json)
writes verdicts whose `timings` hold the measured kernel and XLA times at each bench case and
whose `predicted_speedup` holds what each prediction was computed from. This command fits the
constants (evaluator/performance/fit.py) to those times and writes them where the model reads
them (docs/performance-model.md, "Refit on your TPU").
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from cli.options import UsageError, console
from evaluator.performance import calibration as calib
from evaluator.performance.hardware import GENERATIONS


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="refit the speed prediction's constants from TPU timings")
    c.add_argument("verdicts", nargs="+", type=Path,
                   help="JSON verdicts graded with --backend tpu (one per line, or a JSON list)")
    c.add_argument("--out", type=Path, default=calib.DEFAULT_FILE,
                   help=f"where to write the constants (default {calib.DEFAULT_FILE}; another file is read "
                        f"when ${calib.ENV} names it)")
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from evaluator.performance.fit import agreement, fit, log_errors
    from evaluator.performance.prediction import predict_case

    samples, generation = timed_samples([v for path in args.verdicts for v in read_verdicts(path)])
    if not samples:
        raise UsageError("no verdict with TPU timings and a prediction at the same case: grade with "
                         "--backend tpu --json on a TPU host")
    gen = GENERATIONS[generation]
    before = calib.load()
    after = fit(samples, gen, before, fitted_on=f"{len(samples)} cases timed on {generation}: "
                                                 + ", ".join(str(p) for p in args.verdicts))
    calib.save(after, args.out)
    for label, c in (("before", before), ("after", after)):
        preds = [predict_case(s.inputs, gen, c) for s in samples]
        k = agreement([p.kernel_s for p in preds], [s.kernel_s for s in samples])
        x = agreement([p.xla_s for p in preds], [s.xla_s for s in samples])
        console.print(f"{label}: kernels within 2x {k.within_2x:.0%}, XLA within 2x {x.within_2x:.0%}, "
                      f"median |log error| {statistics.median(log_errors(samples, gen, c)):.2f}")
    console.print(f"wrote {args.out} ({len(samples)} cases on {generation})")
    return 0


def read_verdicts(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UsageError(f"verdict file not found: {path}")
    text = path.read_text().strip()
    try:
        data = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON verdicts: {exc}") from None
    return [d for d in data if isinstance(d, dict)]


def timed_samples(verdicts: list[dict[str, Any]]) -> tuple[list, str]:
    """(samples, generation) from verdicts with measured timings and predictions at one case."""
    from evaluator.performance.fit import Sample
    from evaluator.performance.prediction import CaseInputs

    samples, generations = [], set()
    for v in verdicts:
        predicted = v.get("predicted_speedup") or {}
        for case, timing in (v.get("timings") or {}).items():
            inputs = (predicted.get("cases") or {}).get(case, {}).get("inputs")
            if not inputs or not timing.get("kernel_s") or not timing.get("reference_s"):
                continue
            generations.add(predicted["generation"])
            samples.append(Sample(f"{v['task']}/{case}", "timed", CaseInputs.from_dict(inputs),
                                  statistics.median(timing["kernel_s"]), statistics.median(timing["reference_s"])))
    if len(generations) > 1:
        raise UsageError(f"the verdicts were graded for several generations ({', '.join(sorted(generations))}): "
                         "calibrate one at a time")
    return samples, generations.pop() if generations else ""
