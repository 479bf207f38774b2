"""Kernels (our tasks' solutions, or jax's own) and their XLA references timed on a real TPU,
held against the prediction.

    python benchmarks/tpu_timings.py measure --out runs/tpu/v5e.jsonl [--corpus thirdparty|pypi] [--task T ...] [--budget S]   # on a TPU host
    python benchmarks/tpu_timings.py build --corpus pypi   # where the wheels are: writes runs/tpu/pypi/*.py
    python benchmarks/tpu_timings.py compare runs/tpu/v5e.jsonl [MORE.jsonl] [--backend tpu-compile] [--refit [--out F]] [--plot PNG]   # anywhere

`measure` times every task's solution (`--corpus solutions`, the default) or jax's own Pallas
kernels wrapped for our tasks (`--corpus thirdparty`, tests/thirdparty.py: kernels nobody here
wrote, so nothing was fitted on them), or kernels from the ejkernel and tpu-inference wheels
wrapped the same way (`--corpus pypi`, tests/thirdparty_pypi.py), and the task's reference at
each bench case (both splits)
on the chip this process holds, as the grader's timing stage does (evaluator/execution/handlers.py,
`time_callable`: 3 warm-up calls, the wall time of 20, each to block_until_ready), and appends
one JSON line per case; a rerun skips the cases already in the file. It grades nothing: a
solution's correctness is the grader's business (`--backend tpu`); the largest difference
from the reference's output on the same chip is recorded as a sanity check.

`compare` joins those times with the static prediction for the chip's generation (`python -m
evaluator estimate --split all --json`, nothing run, kept in runs/tpu/) and prints the table
of benchmarks/perf_agreement.py for the solutions' train and held-out cases and for each third-party
corpus (the cases the grader passes): share within 2x, median predicted/measured and Spearman for the
XLA references, the kernels and their speedups, and the sign accuracy of "faster than XLA". The
constants in use were fitted on JAXBench's v6e times only, so a generation they never saw is a
held-out test. `--refit` also fits them on the solutions' train cases and shows what that does to
the other sets; `--out` writes the refit where `$PALLAS_KERNEL_GYM_CALIBRATION` can name it.

A third-party corpus's candidates are built into runs/tpu/<corpus>/<name>.py from the packages'
source (jax's from the installed jax; pypi's from $PALLAS_KERNEL_GYM_WHEELS, see
tests/thirdparty_pypi.py). Where that source is missing (a TPU host without the wheels) the files
already there are used: build them first (`build --corpus pypi`) and copy runs/tpu/pypi/ along.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
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


def this_chip() -> tuple[str, Any]:
    """(device kind, our TpuGeneration) of the chip this process holds."""
    import jax

    kind = jax.devices()[0].device_kind
    return kind, GENERATIONS[generation_of(kind)]


def write_rows(path: Path | None, rows: list[dict[str, Any]]) -> None:
    """The rows as JSON lines at `path` (a microbenchmark's --out), if one is given."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


SOLUTION = "solution"  # the `kernel` of a row that times a task's own solution


def _kernel_of(task: Any, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"candidate_{task.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses defined in the file look their module up here
    spec.loader.exec_module(module)
    return next(getattr(module, name) for name in task.entry_points if callable(getattr(module, name, None)))


# Third-party corpora: --corpus name -> (module with CORPUS, BY_NAME and build_source, the name of
# its set in `compare`). Their entries' names are distinct, so a row's kernel names its corpus.
CORPORA = {
    "thirdparty": ("tests.thirdparty", "jax's kernels, all cases"),
    "pypi": ("tests.thirdparty_pypi", "ejkernel/tpu-inference kernels, all cases"),
}


def corpus_module(corpus: str) -> Any:
    return importlib.import_module(CORPORA[corpus][0])


def corpus_of(kernel: str) -> str:
    """The third-party corpus whose entry is named `kernel`."""
    found = [c for c in CORPORA if kernel in corpus_module(c).BY_NAME]
    if not found:
        raise SystemExit(f"{kernel!r} is no entry of {', '.join(m for m, _ in CORPORA.values())}")
    return found[0]


def built_thirdparty(keep: Any, corpus: str = "thirdparty") -> list[tuple[Any, Path]]:
    """(entry, candidate file) for each entry of a third-party corpus that `keep(entry)` accepts,
    built into runs/tpu/<corpus>/ as tests/test_thirdparty.py grades them. Where the kernels'
    source is not here (a TPU host without the wheels), a file already built there is used."""
    from tests.thirdparty import SourceUnavailable

    module = corpus_module(corpus)
    folder = ESTIMATES / corpus
    folder.mkdir(parents=True, exist_ok=True)
    built = []
    for entry in filter(keep, module.CORPUS):
        path = folder / f"{entry.name}.py"
        try:
            path.write_text(module.build_source(entry))
        except SourceUnavailable as exc:
            if not path.is_file():
                raise SystemExit(f"{entry.name}: {exc}; or build {path} elsewhere and copy it here") from exc
        built.append((entry, path))
    return built


def kernels_to_time(corpus: str, names: list[str] | None) -> list[tuple[str, Any, Path]]:
    """(label, task, candidate file) for each kernel of the corpus whose task is chosen."""
    import tasks

    by_name = {t.name: t for t in tasks.all_tasks()}
    chosen = lambda task: names is None or task in names  # noqa: E731
    if corpus == "solutions":
        return [(SOLUTION, t, Path(t.solution_path)) for t in by_name.values() if chosen(t.name)]
    return [(entry.name, by_name[entry.task], path)
            for entry, path in built_thirdparty(lambda e: chosen(e.task), corpus)]


def largest_difference(got: Any, want: Any) -> float:
    """max |got - want| / max |want| over the outputs, computed in f32."""
    import jax
    import numpy as np

    worst = 0.0
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        worst = max(worst, float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)))
    return worst


def measure(out: Path, corpus: str, names: list[str] | None, budget_s: float) -> int:
    import jax
    import numpy as np

    from evaluator.execution.handlers import time_callable

    kind, generation = this_chip()
    done = set()
    if out.is_file():
        done = {(r.get("kernel", SOLUTION), r["task"], r["case"])
                for r in map(json.loads, out.read_text().splitlines()) if r.get("case")}
    out.parent.mkdir(parents=True, exist_ok=True)
    chosen = kernels_to_time(corpus, names)
    # Breadth first: every kernel's first bench case before any kernel's second, so a run cut
    # short by its budget has measured as many kernels as it could.
    queues = [[(label, t, path, c) for c in t.select("train", "bench") + t.select("heldout", "bench")]
              for label, t, path in chosen]
    order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues
             if i < len(q) and (q[i][0], q[i][1].name, q[i][3].name) not in done]
    compiled: dict[tuple[str, str], tuple[Any, Any]] = {}  # (kernel, task): every solution is "solution"
    start, timed = time.perf_counter(), 0
    with open(out, "a") as f:
        for label, task, path, case in order:
            if time.perf_counter() - start > budget_s:
                print(f"budget of {budget_s:.0f} s spent after {timed} cases: rerun to go on", flush=True)
                return 0
            row: dict[str, Any] = {"kernel": label, "task": task.name, "case": case.name, "split": case.split,
                                   "dtype": case.dtype, "generation": generation.name,
                                   "device_kind": kind, "jax": jax.__version__,
                                   "warmup": WARMUP, "iters": ITERS}
            try:
                if (label, task.name) not in compiled:
                    compiled[label, task.name] = jax.jit(_kernel_of(task, path)), jax.jit(task.reference)
                kernel, reference = compiled[label, task.name]
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
            print(f"{label} {task.name}/{case.name}: {figures} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{timed} cases timed on {kind} in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


def _estimated(path: Path, args: list[str]) -> list[dict[str, Any]]:
    """`python -m evaluator estimate --json ARGS` rows, kept in `path` and reused. Written beside
    it first and moved in when the run ends, so an interrupted run leaves no partial file behind
    that a later compare would take as whole."""
    if not path.is_file() or not path.stat().st_size:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "w") as f:
            subprocess.run([sys.executable, "-m", "evaluator", "estimate", "--split", "all", "--json", *args],
                           check=True, stdout=f)
        partial.replace(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def predictions(generation: str, backend: str, kernels: set[str]) -> dict[tuple[str, str, str], CaseInputs]:
    """(kernel, task, case) -> what the prediction is computed from, by `estimate` for the
    generation on the backend: every solution at once (where `kernels` names the solutions), each
    third-party kernel named in `kernels` built and estimated as the candidate of its task. Kept
    in runs/tpu/ and reused."""
    common = ["--tpu", generation, "--backend", backend]
    tag = f"{generation}-{backend}"
    runs = [(SOLUTION, ESTIMATES / f"solutions-{tag}-estimate.jsonl", common)] if SOLUTION in kernels else []
    for corpus in CORPORA:
        for entry, source in built_thirdparty(lambda e: e.name in kernels, corpus):
            runs.append((entry.name, ESTIMATES / f"{entry.name}-{tag}-estimate.jsonl",
                         [*common, "--task", entry.task, "--candidate", str(source)]))
    return {(kernel, r["task"], case): CaseInputs.from_dict(c["inputs"])
            for kernel, path, args in runs for r in _estimated(path, args)
            for case, c in (r.get("cases") or {}).items()}


def graded_correct(row: dict[str, Any]) -> bool:
    """A solution, or a third-party kernel on a split and dtype its corpus entry expects
    `correct` (tests/test_thirdparty.py holds the grader to it): the speed of a kernel the grader
    refuses is not a speed anyone would be paid for."""
    if row.get("kernel", SOLUTION) == SOLUTION:
        return True
    kernel = row["kernel"]
    return corpus_module(corpus_of(kernel)).BY_NAME[kernel].expected_correct(row["split"], row["dtype"])


def timed_samples(rows: list[dict[str, Any]], predicted: dict[tuple[str, str, str], CaseInputs]) -> list[Sample]:
    keys = [(r.get("kernel", SOLUTION), r["task"], r["case"]) for r in rows]
    return [Sample("/".join(key), key[0], predicted[key], statistics.median(r["kernel_s"]),
                   statistics.median(r["reference_s"]))
            for key, r in zip(keys, rows) if "kernel_s" in r and key in predicted]


def compare(paths: list[Path], backend: str, refit: bool, out: Path | None, plot_path: Path | None,
            json_path: Path | None) -> int:
    from perf_agreement import figures, plot, table

    from evaluator.performance.fit import fit

    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    generations = {r["generation"] for r in rows}
    if len(generations) != 1:
        raise SystemExit(f"{', '.join(map(str, paths))} hold timings of {len(generations)} generations: "
                         "compare one at a time")
    gen = GENERATIONS[generations.pop()]
    predicted = predictions(gen.name, backend, {r.get("kernel", SOLUTION) for r in rows})
    solutions = [r for r in rows if r.get("kernel", SOLUTION) == SOLUTION]
    theirs = [r for r in rows if r.get("kernel", SOLUTION) != SOLUTION]
    sets = {f"{split} cases": timed_samples([r for r in solutions if r["split"] == split], predicted)
            for split in ("train", "heldout")}
    for corpus, (_, label) in CORPORA.items():  # nobody here wrote them, nothing was fitted on them
        rows_of = [r for r in theirs if corpus_of(r["kernel"]) == corpus and graded_correct(r)]
        if rows_of:
            sets[label] = timed_samples(rows_of, predicted)
    sets = {name: samples for name, samples in sets.items() if samples}
    if refit and "train cases" not in sets:
        raise SystemExit("--refit fits on the solutions' train cases: give their timings too")
    loaded = calib.load(compiled=backend == "tpu-compile", generation=gen.name)  # what the grader uses there
    constants = {"in use": loaded}
    if refit:  # fitted on the train cases alone: the other sets' rows are a test of the refit
        constants[f"refit on {gen.name} train cases"] = fit(
            sets["train cases"], gen, loaded, fitted_on=f"{len(sets['train cases'])} train cases timed on "
                                                         f"{gen.name}: {', '.join(map(str, paths))}")
    last = list(constants.values())[-1]
    refused = sum(1 for r in theirs if "kernel_s" in r and not graded_correct(r))
    print(f"{sum(map(len, sets.values()))} cases timed on {gen.name} ({rows[0]['device_kind']}, jax {rows[0]['jax']}), "
          f"predicted on {backend}; {sum(1 for r in rows if 'error' in r)} failed to run"
          + (f", {refused} cases of third-party kernels left out (the grader does not pass them)" if theirs else "")
          + f"; constants in use fitted on: {loaded.fitted_on or 'nothing'}\n")
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
        plot(sets, last, plot_path, gen, f"constants {list(constants)[-1]}, {backend}")
        print(f"wrote {plot_path}")
    return 0


def build(corpus: str) -> int:
    """Write a third-party corpus's candidates to runs/tpu/<corpus>/, to carry to a TPU host."""
    for entry, path in built_thirdparty(lambda e: True, corpus):
        print(f"{path}  ({entry.task})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on a TPU host: time every solution and reference at its bench cases")
    m.add_argument("--out", type=Path, required=True, help="JSONL of timings, appended to (a rerun resumes)")
    m.add_argument("--corpus", choices=("solutions", *CORPORA), default="solutions",
                   help="whose kernels: the tasks' solutions, jax's own (thirdparty: tests/thirdparty.py), "
                        "or ejkernel's and tpu-inference's (pypi: tests/thirdparty_pypi.py)")
    m.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    m.add_argument("--budget", type=float, default=float("inf"), help="stop starting cases after S seconds")
    b = sub.add_parser("build", help="write a third-party corpus's candidates to runs/tpu/<corpus>/")
    b.add_argument("--corpus", choices=tuple(CORPORA), required=True)
    c = sub.add_parser("compare", help="hold the timings against the static prediction")
    c.add_argument("timings", type=Path, nargs="+", help="JSONL written by measure (one generation)")
    c.add_argument("--backend", choices=("tpu-interpret", "tpu-compile"), default="tpu-interpret",
                   help="estimate's backend for the prediction (tpu-compile: the glue priced by libtpu's compile)")
    c.add_argument("--refit", action="store_true",
                   help="also refit the constants on the train cases' timings and test them on the held-out cases'")
    c.add_argument("--out", type=Path, default=None, help="write the constants shown last (the refit) here")
    c.add_argument("--plot", type=Path, default=None, help="scatter plot of predicted vs measured (PNG)")
    c.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.command == "measure":
        return measure(args.out, args.corpus, args.task, args.budget)
    if args.command == "build":
        return build(args.corpus)
    return compare(args.timings, args.backend, args.refit, args.out, args.plot, args.json)


if __name__ == "__main__":
    sys.exit(main())
