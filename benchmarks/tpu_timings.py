"""Our tasks' solutions and their XLA references timed on a real TPU, held against the prediction.

    python benchmarks/tpu_timings.py measure --out runs/tpu/v5e.jsonl [--task T ...] [--budget S]   # on a TPU host
    python benchmarks/tpu_timings.py compare runs/tpu/v5e.jsonl [--refit [--out F]] [--plot PNG]   # anywhere

`measure` times every task's solution and reference at each bench case (both splits) on the
chip this process holds, as the grader's timing stage does (evaluator/execution/handlers.py,
`time_callable`: 3 warm-up calls, the wall time of 20, each to block_until_ready), and appends
one JSON line per case; a rerun skips the cases already in the file. It grades nothing: a
solution's correctness is the grader's business (`--backend tpu`); the largest difference
from the reference's output on the same chip is recorded as a sanity check.

`compare` joins those times with the static prediction for the chip's generation (`python -m
evaluator estimate --split all --json`, nothing run, kept in runs/tpu/) and prints the table
of benchmarks/perf_agreement.py for the train and the held-out cases: share within 2x, median
predicted/measured and Spearman for the XLA references, the kernels and their speedups, and the
sign accuracy of "faster than XLA". The constants in use were fitted on JAXBench's v6e times
only, so a generation they never saw is a held-out test. `--refit` also fits them on the train
cases' timings and shows what that does to the held-out cases'; `--out` writes the refit where
`$PALLAS_KERNEL_GYM_CALIBRATION` can name it.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluator.performance import calibration as calib  # noqa: E402
from evaluator.performance.fit import Agreement, Sample  # noqa: E402
from evaluator.performance.hardware import GENERATIONS  # noqa: E402
from evaluator.performance.prediction import CaseInputs  # noqa: E402

WARMUP, ITERS = 3, 20
ESTIMATES = Path("runs/tpu")


def generation_of(device_kind: str) -> str:
    found = [g.name for g in GENERATIONS.values() if g.device_kind == device_kind]
    if not found:
        raise SystemExit(f"no TPU generation of ours is a {device_kind!r}: "
                         f"{', '.join(g.device_kind for g in GENERATIONS.values())}")
    return found[0]


def _kernel_of(task: Any) -> Any:
    spec = importlib.util.spec_from_file_location(f"solution_{task.name}", task.solution_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return next(getattr(module, name) for name in task.entry_points if callable(getattr(module, name, None)))


def largest_difference(got: Any, want: Any) -> float:
    """max |got - want| / max |want| over the outputs, computed in f32."""
    import jax
    import numpy as np

    worst = 0.0
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        worst = max(worst, float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)))
    return worst


def measure(out: Path, names: list[str] | None, budget_s: float) -> int:
    import jax
    import numpy as np

    import tasks
    from evaluator.execution.handlers import time_callable

    device = jax.devices()[0]
    generation = generation_of(device.device_kind)
    done = set()
    if out.is_file():
        done = {(r["task"], r["case"]) for r in map(json.loads, out.read_text().splitlines()) if r.get("case")}
    out.parent.mkdir(parents=True, exist_ok=True)
    chosen = [t for t in tasks.all_tasks() if names is None or t.name in names]
    # Breadth first: every task's first bench case before any task's second, so a run cut short
    # by its budget has measured as many tasks as it could.
    queues = [[(t, c) for c in t.select("train", "bench") + t.select("heldout", "bench")] for t in chosen]
    order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues
             if i < len(q) and (q[i][0].name, q[i][1].name) not in done]
    compiled: dict[str, tuple[Any, Any]] = {}
    start, timed = time.perf_counter(), 0
    with open(out, "a") as f:
        for task, case in order:
            if time.perf_counter() - start > budget_s:
                print(f"budget of {budget_s:.0f} s spent after {timed} cases: rerun to go on", flush=True)
                return 0
            row: dict[str, Any] = {"task": task.name, "case": case.name, "split": case.split, "dtype": case.dtype,
                                   "generation": generation, "device_kind": device.device_kind,
                                   "jax": jax.__version__, "warmup": WARMUP, "iters": ITERS}
            try:
                if task.name not in compiled:
                    compiled[task.name] = jax.jit(_kernel_of(task)), jax.jit(task.reference)
                kernel, reference = compiled[task.name]
                inputs = [jax.device_put(a) for a in task.make_inputs(case, np.random.default_rng(0))]
                row["kernel_s"] = time_callable(kernel, inputs, WARMUP, ITERS)
                row["reference_s"] = time_callable(reference, inputs, WARMUP, ITERS)
                row["largest_difference"] = largest_difference(kernel(*inputs), reference(*inputs))
            except Exception as exc:  # one case's failure is a row, not the end of the run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            f.write(json.dumps(row) + "\n")
            f.flush()
            timed += 1
            figures = (f"kernel {statistics.median(row['kernel_s']) * 1e3:.3f} ms, "
                       f"XLA {statistics.median(row['reference_s']) * 1e3:.3f} ms"
                       if "largest_difference" in row else row["error"][:160])
            print(f"{task.name}/{case.name}: {figures} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{timed} cases timed on {device.device_kind} in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


def predictions(generation: str, beside: Path) -> dict[tuple[str, str], CaseInputs]:
    """(task, case) -> what the prediction is computed from, by `estimate` for the generation;
    kept in runs/tpu/ and reused."""
    path = ESTIMATES / f"{beside.stem}-estimate.jsonl"
    if not path.is_file() or not path.stat().st_size:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            subprocess.run([sys.executable, "-m", "evaluator", "estimate", "--split", "all", "--tpu", generation,
                            "--json"], check=True, stdout=f)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["task"], case): CaseInputs.from_dict(c["inputs"])
            for r in rows for case, c in (r.get("cases") or {}).items()}


def timed_samples(rows: list[dict[str, Any]], predicted: dict[tuple[str, str], CaseInputs]) -> list[Sample]:
    return [Sample(f"{r['task']}/{r['case']}", "solutions", predicted[(r["task"], r["case"])],
                   statistics.median(r["kernel_s"]), statistics.median(r["reference_s"]))
            for r in rows if "kernel_s" in r and (r["task"], r["case"]) in predicted]


def compare(path: Path, refit: bool, out: Path | None, plot_path: Path | None, json_path: Path | None) -> int:
    from perf_agreement import figures, plot, table

    from evaluator.performance.fit import fit

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    generations = {r["generation"] for r in rows}
    if len(generations) != 1:
        raise SystemExit(f"{path} holds timings of {len(generations)} generations: compare one at a time")
    gen = GENERATIONS[generations.pop()]
    predicted = predictions(gen.name, path)
    sets = {f"{split} cases": timed_samples([r for r in rows if r["split"] == split], predicted)
            for split in ("train", "heldout")}
    loaded = calib.load()
    constants = {"in use": loaded}
    if refit:  # fitted on the train cases alone: the held-out cases' row is a test of the refit
        constants[f"refit on {gen.name} train cases"] = fit(
            sets["train cases"], gen, loaded, fitted_on=f"{len(sets['train cases'])} train cases timed on "
                                                         f"{gen.name}: {path}")
    last = list(constants.values())[-1]
    print(f"{sum(map(len, sets.values()))} cases timed on {gen.name} ({rows[0]['device_kind']}, jax {rows[0]['jax']}); "
          f"{sum(1 for r in rows if 'error' in r)} failed to run; constants in use fitted on: "
          f"{loaded.fitted_on or 'nothing'}\n")
    print(table(sets, constants, gen))
    if refit:
        print(f"\nrefit: {last}")
    if out:
        calib.save(last, out)
        print(f"wrote {out}")
    if json_path:
        json_path.write_text(json.dumps(
            {label: {name: {k: dataclasses.asdict(v) if isinstance(v, Agreement) else v
                            for k, v in figures(samples, c, gen).items()} for name, samples in sets.items()}
             for label, c in constants.items()}, indent=2))
    if plot_path:
        plot(sets, last, plot_path, gen, f"our tasks' solutions, constants {list(constants)[-1]}")
        print(f"wrote {plot_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on a TPU host: time every solution and reference at its bench cases")
    m.add_argument("--out", type=Path, required=True, help="JSONL of timings, appended to (a rerun resumes)")
    m.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    m.add_argument("--budget", type=float, default=float("inf"), help="stop starting cases after S seconds")
    c = sub.add_parser("compare", help="hold the timings against the static prediction")
    c.add_argument("timings", type=Path)
    c.add_argument("--refit", action="store_true",
                   help="also refit the constants on the train cases' timings and test them on the held-out cases'")
    c.add_argument("--out", type=Path, default=None, help="write the constants shown last (the refit) here")
    c.add_argument("--plot", type=Path, default=None, help="scatter plot of predicted vs measured (PNG)")
    c.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.command == "measure":
        return measure(args.out, args.task, args.budget)
    return compare(args.timings, args.refit, args.out, args.plot, args.json)


if __name__ == "__main__":
    sys.exit(main())
