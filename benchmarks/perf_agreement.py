"""Predicted TPU times held against JAXBench's measured v6e times (nothing here ran on a TPU).

    python benchmarks/perf_agreement.py --suite /path/to/JAXBench [--fit] [--heldout] [--plot PNG]

Measured: `benchmark/results.csv` (device-profiler times of the benchmark workloads' XLA baselines
and optimized kernels; the k-workloads timed in bf16, as their run_all.py builds them) and
`pallas_eval/results/eval_<model>.json` (wall-clock times of each generated kernel that their
harness found correct, and of the reference it faced; their harness closes over a KernelBench
model's weights, zeros in most of level 2, which XLA folds: the reference is compiled as they
timed it, `HarnessTiming`). Predicted: `python -m evaluator estimate
--suite jaxbench:PATH [--attempts MODEL] --json`, run once into runs/perf-agreement/ and reused.

`--fit` fits the calibration constants on the tuning set only (the benchmark workloads and
GPT-5.3's kernels and references) and writes them to evaluator/performance/calibration.json;
`--heldout` adds Gemini 3's kernels, which nothing was fitted on: run it once, at the end.
`--measured DIR` holds the kernels against timings taken again on another chip
(benchmarks/jaxbench_timings.py on a TPU host: eval_<model>.json in their shape), predicted for
that chip's generation; the benchmark workloads, timed by JAXBench alone, are left out.
Prints a Markdown table (docs/performance-model.md) of, per set: share within 2x, median
predicted/measured, Spearman, and for kernels the sign accuracy of "faster than XLA" beside its
base rate.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluator.performance import calibration as calib  # noqa: E402
from evaluator.performance.fit import KERNEL_SIDE, RANGES, Agreement, Sample, agreement, as_measured, fit  # noqa: E402
from evaluator.performance.hardware import GENERATIONS, TpuGeneration  # noqa: E402
from evaluator.performance.prediction import CaseInputs  # noqa: E402
from evaluator.performance.xla_cost import ReferenceWork, XlaProgramCost  # noqa: E402

TUNING_MODEL, HELDOUT_MODEL = "gpt53", "gemini3"
RUNS = Path("runs/perf-agreement")
GEN = GENERATIONS["v6e"]  # JAXBench measured on v6e


def estimate_rows(suite: Path, model: str | None, workers: int, backend: str = "tpu-interpret",
                  gen: TpuGeneration = GEN, tasks: set[str] | None = None) -> list[dict[str, Any]]:
    """`estimate --json` rows for the suite's solutions (model None) or one model's attempts (of
    `tasks` only, where given), from runs/perf-agreement/ when an earlier run left them all."""
    out = RUNS / (f"{model or 'solutions'}{'' if backend == 'tpu-interpret' else '-' + backend}"
                  f"{'' if gen is GEN else '-' + gen.name}.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    if not rows or (tasks and not tasks <= {r["task"] for r in rows}):
        RUNS.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "evaluator", "estimate", "--suite", f"jaxbench:{suite}", "--json",
               "--workers", str(workers), "--tpu", gen.name, "--backend", backend] + (
                   ["--attempts", model] if model else []) + [a for t in sorted(tasks or ()) for a in ("--task", t)]
        with open(out, "w") as f:
            subprocess.run(cmd, check=True, stdout=f)
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return rows


def measured_on(folder: Path) -> TpuGeneration:
    """The generation whose chip took the timings in `folder` (benchmarks/jaxbench_timings.py)."""
    from tpu_timings import generation_of

    kinds = {json.loads(p.read_text())["metadata"]["device_kind"] for p in folder.glob("eval_*.json")}
    if len(kinds) != 1:
        raise SystemExit(f"{folder} holds timings of {len(kinds)} kinds of chip ({', '.join(sorted(kinds))}): "
                         "one at a time")
    return GENERATIONS[generation_of(kinds.pop())]


def timed_tasks(results: Path, model: str) -> set[str]:
    """Our task names of the kernels a results file has times for."""
    from suites.attempts import records_by_key, task_name

    return {task_name(group, name) for (group, name), r in records_by_key(results / f"eval_{model}.json").items()
            if r.get("generated_ms") and r.get("original_ms")}


def case_inputs(row: dict[str, Any]) -> CaseInputs | None:
    cases = row.get("cases") or {}
    return CaseInputs.from_dict(next(iter(cases.values()))["inputs"]) if cases else None


def workload_samples(suite: Path, rows: list[dict[str, Any]], bf16: dict[str, CaseInputs]) -> list[Sample]:
    """The benchmark workloads: XLA baselines and optimized kernels, as timed (bf16 where bf16)."""
    measured: dict[str, dict[str, float]] = {}
    with open(suite / "benchmark" / "results.csv") as f:
        for r in csv.DictReader(f):
            if r["status"] == "success":
                times = measured.setdefault(f"jaxbench/{r['workload']}", {})
                times[r["variant"]] = float(r["median_ms"]) / 1e3
                times["device"] = float(r["timing_method"] == "device_profiler")
    samples = []
    for row in rows:
        times, inputs = measured.get(row["task"]), bf16.get(row["task"]) or case_inputs(row)
        if not times or inputs is None:
            continue
        kernel_s = times.get("optimized") if row["task"] not in bf16 else None
        samples.append(Sample(row["task"], "benchmark", inputs, kernel_s, times.get("baseline"),
                              device_timed=bool(times["device"])))
    return samples


def bf16_inputs(suite: Path, rows: list[dict[str, Any]]) -> dict[str, CaseInputs]:
    """The k-workloads' references at the bf16 inputs JAXBench timed (our adapter builds f32):
    XLA's cost compiled at bf16, our count with no f32 matmul and no extra MXU pass (a HIGH or
    HIGHEST dot of bf16 operands takes one pass, as a default one does)."""
    from evaluator.digest import task_digest
    from evaluator.stages import case_spec
    from evaluator.truth.xla_reference import ReferenceCosts
    from suites.resolver import TaskResolver

    out = {}
    costs = ReferenceCosts(task_digest)
    with TaskResolver([f"jaxbench:{suite}"]) as resolver:
        for row in rows:
            inputs = case_inputs(row)
            if inputs is None or not row["task"].split("/")[-1].split("_")[0].endswith("k"):
                continue
            task = resolver.task(row["task"], run_reference=False)  # compiled, never run
            case = next(c for c in task.cases if c.name in row["cases"])
            spec = case_spec(task, case)
            spec.args = [(shape, "bfloat16" if dtype == "float32" else dtype) for shape, dtype in spec.args]
            spec.name += "_as_bf16"
            xla = costs.cost(task, case, spec, GEN)
            reference = dataclasses.replace(inputs.reference, f32_matmul_flops=0.0, multipass_flops=0.0)
            out[row["task"]] = dataclasses.replace(
                inputs, reference=reference, ideal_bytes=inputs.ideal_bytes / 2,
                xla=xla if not isinstance(xla, str) else None, xla_unavailable=xla if isinstance(xla, str) else "")
    costs.close()
    return out


class HarnessTiming:
    """KernelBench references and kernels as JAXBench's harness timed them
    (suites/jaxbench_harness.py: the model's own weights closed over, zeros in most of level 2,
    which XLA folds away), compiled when first asked for. A reference: XLA's cost of that program,
    and our count of the reference's work (f32 matmuls, extra MXU passes, convolutions) scaled by
    the share of its FLOPs XLA kept (its count of the timed program over its count with the
    weights as arguments). A kernel compiled for its prediction (`--backend tpu-compile`): the
    same for the glue around its Pallas calls (a matmul by the zero weights left to XLA is folded
    there too; the Pallas calls never are)."""

    DRIVER = "suites.jaxbench_harness:harness_timed_reference"
    CANDIDATE_DRIVER = "suites.jaxbench_harness:harness_timed_candidate"

    def __init__(self, suite: Path, gen: TpuGeneration = GEN):
        from evaluator.digest import code_digest, task_digest
        from evaluator.truth.xla_reference import ReferenceCosts
        from suites.resolver import TaskResolver

        harness = code_digest(("suites.jaxbench_harness",))  # not in the adapter's digest
        self.costs = ReferenceCosts(lambda task: task_digest(task) + harness + task.external.timed_digest)
        self.resolver = TaskResolver([f"jaxbench:{suite}"])
        self.gen = gen

    def _timed(self, row: dict[str, Any], source: str | None) -> XlaProgramCost | None:
        """XLA's cost of the row's task's reference (`source` None) or of a candidate's program
        (its source), as the harness timed it at the row's case; None where it has no figure."""
        from evaluator.stages import case_spec

        task = self.resolver.task(row["task"], run_reference=False)
        case = next(c for c in task.cases if c.name in row["cases"])
        spec = case_spec(task, case)
        spec.args = spec.args[:task.external.described[case.name].n_inputs]
        spec.name += "_as_harness_timed"
        reference = task.external.sources[case.name]
        timed = (_Timed(task.external, (source, self.CANDIDATE_DRIVER, [reference]),
                        hashlib.sha256(source.encode()).hexdigest()) if source is not None
                 else _Timed(task.external, (reference, self.DRIVER, [])))
        xla = self.costs.cost(dataclasses.replace(task, external=timed), case, spec, self.gen)
        return None if isinstance(xla, str) else xla

    def inputs(self, row: dict[str, Any], inputs: CaseInputs, candidate: str | None = None) -> CaseInputs:
        """The row's case inputs with its reference as the harness timed it, and the glue of
        `candidate` (its source) too where XLA priced that glue (a compiled path's row: the
        default path's count of the glue has no compile of what was timed to follow).
        Unchanged for a priority workload, whose inputs their harness passes as arguments, as we do."""
        if not row["task"].startswith("kernelbench-jax/"):
            return inputs
        xla = self._timed(row, None)
        if xla is not None:  # else no figure for what was timed: the reference's as a grading times it
            whole = inputs.xla.flops if inputs.xla is not None else inputs.reference.flops
            r = _scaled(inputs.reference, _kept(xla.flops, whole))
            inputs = dataclasses.replace(inputs, reference=r, xla=xla, xla_unavailable="")
        if candidate is None or inputs.glue_xla is None:
            return inputs
        glue = self._timed(row, candidate)
        if glue is None:
            return inputs
        w = _scaled(inputs.glue_work, _kept(glue.flops, inputs.glue_xla.flops))
        return dataclasses.replace(
            inputs, glue_flops=w.flops, glue_f32_matmul_flops=w.f32_matmul_flops, glue_conv_flops=w.conv_flops,
            glue_conv_mxu_flops=w.conv_mxu_flops, glue_conv_skipped_flops=w.conv_skipped_flops,
            glue_multipass_flops=w.multipass_flops, glue_xla=glue)

    def close(self) -> None:
        self.costs.close()
        self.resolver.close()


def _kept(timed_flops: float, whole_flops: float) -> float:
    """The share of a program's FLOPs XLA kept in the timed program."""
    return min(1.0, timed_flops / whole_flops) if whole_flops > 0 else 1.0


def _scaled(work: ReferenceWork, kept: float) -> ReferenceWork:
    return dataclasses.replace(work, flops=work.flops * kept, f32_matmul_flops=work.f32_matmul_flops * kept,
                               conv_flops=work.conv_flops * kept, conv_mxu_flops=work.conv_mxu_flops * kept,
                               conv_skipped_flops=work.conv_skipped_flops * kept,
                               multipass_flops=work.multipass_flops * kept)


class _Timed:
    """An imported task's reference (oracle.SuiteReference) whose timed program is another one
    (`timed_digest`: that program's source hash where it is not the reference's own)."""

    def __init__(self, external: Any, timed: tuple[str, str, list[Any]], timed_digest: str = ""):
        self._external, self._timed, self.timed_digest = external, timed, timed_digest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._external, name)

    def timing_reference(self, case: Any) -> tuple[str, str, list[Any]]:
        return self._timed


def attempt_samples(suite: Path, model: str, rows: list[dict[str, Any]], harness: HarnessTiming,
                    results: Path | None = None, timing: str = "ms") -> list[Sample]:
    """A model's kernels that JAXBench's harness found correct and timed, with their references
    as it timed them: their times, or those in `results` (the same files' shape) taken again;
    `timing` "pipelined_ms" reads that run's back-to-back figure instead of the mean call."""
    from suites.attempts import RESULTS, discover, records_by_key

    timed = {a.key: a for a in discover(suite, [model]) if a.theirs is not None and a.theirs.verdict == "correct"}
    records = records_by_key((results or suite / RESULTS) / f"eval_{model}.json")
    samples = []
    for row in rows:
        attempt = timed.get(row["candidate"])
        inputs = case_inputs(row)
        if attempt is None or inputs is None:
            continue
        record = records.get((attempt.group, attempt.path.stem.removesuffix(f"_{model}")))
        if not record or not record.get(f"generated_{timing}") or not record.get(f"original_{timing}"):
            continue
        samples.append(Sample(row["candidate"], model, harness.inputs(row, inputs, attempt.text()),
                              record[f"generated_{timing}"] / 1e3, record[f"original_{timing}"] / 1e3))
    return samples


def figures(samples: list[Sample], c: calib.Calibration, gen: TpuGeneration = GEN) -> dict[str, Any]:
    predicted = [(as_measured(s, gen, c), s) for s in samples]
    kernel = [(p, s) for p, s in predicted if s.kernel_s]
    xla = [(p, s) for p, s in predicted if s.xla_s]
    both = [(p, s) for p, s in kernel if s.xla_s]
    out: dict[str, Any] = {
        "kernel": agreement([p[0] for p, _ in kernel], [s.kernel_s for _, s in kernel]),
        "xla": agreement([p[1] for p, _ in xla], [s.xla_s for _, s in xla]),
        "speedup": agreement([p[2] for p, _ in both], [s.xla_s / s.kernel_s for _, s in both])}
    if both:
        faster = [s.xla_s > s.kernel_s for _, s in both]
        out["sign_accuracy"] = sum((p[2] > 1) == f for (p, _), f in zip(both, faster)) / len(both)
        out["base_rate"] = max(sum(faster), len(faster) - sum(faster)) / len(faster)
    return out


def flop_check(cases: list[CaseInputs]) -> str:
    """Our FLOP count of each reference, as a grading compiles it, against XLA's where XLA sees
    all of it (no custom call, no loop): a check of the counting both sides of the prediction
    rest on."""
    whole = {(i.xla.flops, i.xla.bytes_accessed, i.reference.flops): i for i in cases
             if i.xla is not None and not i.xla.custom_calls and not i.xla.while_loops and i.reference.flops > 0}
    seen = list(whole.values())  # each reference once, however many kernels faced it
    # Taps on a transposed convolution's inserted zeros: in our count (for the work rules), not in XLA's.
    close = sum(1 for i in seen
                if abs(i.xla.flops / (i.reference.flops - i.reference.conv_skipped_flops) - 1) <= 0.1)
    return (f"our FLOP count of the reference within 10% of XLA's for {close} of {len(seen)} references "
            "XLA sees whole (no custom call, no loop)")


def table(sets: dict[str, list[Sample]], constants: dict[str, calib.Calibration], gen: TpuGeneration = GEN) -> str:
    """A Markdown table: a row per set and labelled constants (e.g. "assumed", "fitted")."""
    lines = ["| set | constants | XLA refs within 2x | median ratio | Spearman | kernels within 2x | median ratio "
             "| Spearman | speedup Spearman | faster-than-XLA accuracy (base rate) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def cells(a: Agreement) -> list[str]:
        rho = "-" if a.spearman is None else f"{a.spearman:.2f}"
        return [f"{a.within_2x:.0%} of {a.n}", f"{a.median_ratio:.2f}", rho] if a.n else ["-", "-", "-"]

    for name, samples in sets.items():
        for label, c in constants.items():
            f = figures(samples, c, gen)
            sign = (f"{f['sign_accuracy']:.0%} ({f['base_rate']:.0%})" if "sign_accuracy" in f else "-")
            rho = f["speedup"].spearman
            lines.append("| " + " | ".join([name, label, *cells(f["xla"]), *cells(f["kernel"]),
                                            "-" if rho is None else f"{rho:.2f}", sign]) + " |")
    return "\n".join(lines)


def plot(sets: dict[str, list[Sample]], c: calib.Calibration, path: Path, gen: TpuGeneration = GEN,
         title: str = "JAXBench") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for name, samples in sets.items():
        preds = [(as_measured(s, gen, c), s) for s in samples]
        xs = [s.xla_s * 1e3 for _, s in preds if s.xla_s] + [s.kernel_s * 1e3 for _, s in preds if s.kernel_s]
        ys = [p[1] * 1e3 for p, s in preds if s.xla_s] + [p[0] * 1e3 for p, s in preds if s.kernel_s]
        axes[0].scatter(xs, ys, s=12, alpha=0.7, label=name)
        both = [(p, s) for p, s in preds if s.xla_s and s.kernel_s]
        axes[1].scatter([s.xla_s / s.kernel_s for _, s in both], [p[2] for p, _ in both], s=12, alpha=0.7,
                        label=name)
    for ax, what in zip(axes, ("time (ms): XLA references and kernels", "speedup over XLA")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [2 * lo, 2 * hi], "k:", lw=0.6)
        ax.plot([lo, hi], [lo / 2, hi / 2], "k:", lw=0.6)
        ax.set_xlabel(f"measured on TPU {gen.name} ({what})")
        ax.set_ylabel("predicted without a TPU")
        ax.legend(fontsize=8)
    fig.suptitle(f"Predicted vs measured ({title}, {gen.name}); dotted: within 2x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", type=Path, required=True, help="a JAXBench checkout")
    p.add_argument("--fit", action="store_true",
                   help="fit the constants on the tuning set and write them (with --measured: the constants "
                        "but the kernel side, on the tuning model's kernels timed on that chip)")
    p.add_argument("--calibration", type=Path, default=None,
                   help=f"where --fit writes (default {calib.DEFAULT_FILE.name}, or {calib.COMPILED_FILE.name} "
                        "with --backend tpu-compile; with --measured, the generation's own file)")
    p.add_argument("--heldout", action="store_true", help=f"also {HELDOUT_MODEL}'s kernels (held out: run once)")
    p.add_argument("--plot", type=Path, default=None, help="write the scatter plot here")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    p.add_argument("--backend", choices=("tpu-interpret", "tpu-compile"), default="tpu-interpret",
                   help="estimate's backend: tpu-compile prices the glue around kernels by XLA's compile")
    p.add_argument("--measured", type=Path, default=None,
                   help="a folder of eval_<model>.json timed again on a TPU (benchmarks/jaxbench_timings.py): "
                        "hold the kernels against those times, predicted for that chip")
    p.add_argument("--timing", choices=("mean", "pipelined"), default="mean",
                   help="with --measured: their harness's mean call (default) or the back-to-back figure")
    args = p.parse_args(argv)
    if args.timing != "mean" and not args.measured:
        p.error("--timing needs --measured (JAXBench's own files have their mean call only)")
    gen = measured_on(args.measured) if args.measured else GEN
    timing = "ms" if args.timing == "mean" else "pipelined_ms"
    rows = functools.partial(estimate_rows, args.suite, workers=args.workers, backend=args.backend, gen=gen)
    compiled = args.backend == "tpu-compile"
    args.calibration = args.calibration or (calib.generation_file(compiled, gen.name) if args.measured
                                            else calib.COMPILED_FILE if compiled else calib.DEFAULT_FILE)
    models = [TUNING_MODEL] + ([HELDOUT_MODEL] if args.heldout else [])
    on = f", timed on {gen.name}" if args.measured else ""

    def kernels(model: str, harness: HarnessTiming) -> list[Sample]:
        tasks = timed_tasks(args.measured, model) if args.measured else None
        return attempt_samples(args.suite, model, rows(model, tasks=tasks), harness, args.measured, timing)

    solutions = [] if args.measured else rows(None)  # the references come with the kernels' rows
    with contextlib.closing(HarnessTiming(args.suite, gen)) as harness:
        sets = {} if args.measured else {
            "benchmark workloads": workload_samples(args.suite, solutions, bf16_inputs(args.suite, solutions))}
        sets[f"{TUNING_MODEL} kernels{on}"] = kernels(TUNING_MODEL, harness)
        before = calib.Calibration()
        after = calib.load(compiled=compiled, generation=gen.name)
        if args.fit and args.measured:  # the kernel side stays as the chip's microbenchmarks fitted it
            tuning = sets[f"{TUNING_MODEL} kernels{on}"]
            after = fit(tuning, gen, after, tuple(c for c in RANGES if c not in KERNEL_SIDE),
                        fitted_on=f"{after.fitted_on.partition('; the rest: ')[0]}; the rest: {TUNING_MODEL}'s "
                                  f"kernels timed on {gen.name} ({len(tuning)} cases, {args.timing} call)")
            calib.save(after, args.calibration)
            print(f"wrote {args.calibration}: {after}", file=sys.stderr)
        elif args.fit:
            after = fit([s for samples in sets.values() for s in samples], GEN, before,
                        fitted_on=f"JAXBench v6e: benchmark workloads and {TUNING_MODEL}'s kernels "
                                  f"({sum(map(len, sets.values()))} cases)")
            calib.save(after, args.calibration)
            print(f"wrote {args.calibration}: {after}", file=sys.stderr)
        for model in models[1:]:
            sets[f"{model} kernels (held out){on}"] = kernels(model, harness)
    print(table(sets, {"assumed": before, "fitted": after}, gen))
    if solutions:
        print("\n" + flop_check([i for i in map(case_inputs, solutions) if i is not None]))
    if args.plot:
        plot(sets, after, args.plot, gen, "JAXBench" + on)
    if args.json:
        args.json.write_text(json.dumps({name: {k: (dataclasses.asdict(v) if isinstance(v, Agreement) else v)
                                                for k, v in figures(samples, after, gen).items()}
                                         for name, samples in sets.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
