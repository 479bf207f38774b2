"""JAXBench's generated kernels that their harness found correct, and the references they faced,
timed again on the TPU this process holds, as their harness timed them: a held-out test of the
speed prediction on a chip and timings nothing was fitted on.

    python benchmarks/jaxbench_timings.py --suite PATH --model gemini3 --out DIR [--budget S]   # on a TPU host
    python benchmarks/perf_agreement.py --suite PATH --measured DIR --heldout [--backend tpu-compile]   # anywhere

Writes DIR/eval_<model>.json in the shape of their results file (pallas_eval/results/), which
`perf_agreement.py --measured DIR` reads in its place: per kernel `original_ms` and `generated_ms`,
the mean wall time of 20 calls after 3 warm-up ones, each to `block_until_ready` (their
pallas_eval harness's method; ours, evaluator/execution/handlers.py `time_callable`, is the same),
on the program their harness jitted (suites/jaxbench_harness.py: a KernelBench model's weights
closed over; a priority workload's inputs passed). Beside them, per program: the median call and
`*_pipelined_ms`, 20 calls issued back to back and waited on once (what a host's per-call
synchronisation adds drops out), and the largest difference of the kernel's output from the
reference's on this chip. A rerun into the same DIR skips what is there.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WARMUP, ITERS = 3, 20


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _programs(suite: Path, model: str, group: str, name: str) -> tuple[Callable, Callable, list]:
    """(reference, kernel, inputs) as their harness built them for one generated file."""
    from suites.attempts import GENERATED, LEVEL_PREFIX, PRIORITY_GROUP
    from suites.jaxbench_harness import harness_timed_candidate, harness_timed_reference

    generated = _module(suite / GENERATED / model / group / f"{name}.py", f"generated_{model}_{group}_{name}")
    if group == PRIORITY_GROUP:
        original = _module(suite / PRIORITY_GROUP / name / "baseline.py", f"original_{group}_{name}")
        return original.workload, generated.workload, list(original.create_inputs())
    path = suite / "jaxkernelbench" / group.removeprefix(LEVEL_PREFIX) / f"{name}.py"
    original = _module(path, f"original_{group}_{name}")
    return (harness_timed_reference(original), harness_timed_candidate(generated, path.read_text()),
            list(original.get_inputs()))


def call_timings(fn: Callable, inputs: list) -> dict[str, float]:
    import jax

    from evaluator.execution.handlers import time_callable

    calls = time_callable(fn, inputs, WARMUP, ITERS)
    start = time.perf_counter()
    for _ in range(ITERS):
        out = fn(*inputs)
    jax.block_until_ready(out)
    return {"ms": statistics.mean(calls) * 1e3, "median_ms": statistics.median(calls) * 1e3,
            "pipelined_ms": (time.perf_counter() - start) / ITERS * 1e3}


def measure(suite: Path, model: str, out_dir: Path, budget_s: float) -> int:
    import jax

    from suites.attempts import RESULTS, read_results, record_key
    from tpu_timings import largest_difference

    theirs = read_results(suite, model)
    if not theirs:
        raise SystemExit(f"no results of {model!r} in {suite}: {suite / RESULTS} has no eval_{model}.json "
                         "(a JAXBench checkout?)")
    chosen = {key: r for key, r in theirs.items() if r.get("correct") and r.get("generated_ms")}
    out = out_dir / f"eval_{model}.json"
    device = jax.devices()[0]
    done = json.loads(out.read_text()) if out.is_file() else {
        "metadata": {"device_kind": device.device_kind, "jax": jax.__version__, "warmup": WARMUP, "iters": ITERS,
                     "method": "mean wall time per call, each to block_until_ready (their harness's)"},
        "results": []}
    seen = {record_key(r) for r in done["results"]}
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for key, record in chosen.items():
        if key in seen:
            continue
        if time.perf_counter() - start > budget_s:
            print(f"budget of {budget_s:.0f} s spent: rerun to go on", flush=True)
            break
        row: dict[str, Any] = {k: record.get(k) for k in ("name", "suite", "level", "model")}
        try:
            reference, kernel, inputs = _programs(suite, model, *key)
            reference, kernel = jax.jit(reference), jax.jit(kernel)
            for side, fn in (("original", reference), ("generated", kernel)):
                t = call_timings(fn, inputs)
                row.update({f"{side}_ms": t["ms"], f"{side}_median_ms": t["median_ms"],
                            f"{side}_pipelined_ms": t["pipelined_ms"]})
            row["largest_difference"] = largest_difference(kernel(*inputs), reference(*inputs))
            row["status"], row["correct"] = "success", True  # their verdict; ours is largest_difference
        except Exception as exc:  # one kernel's failure is a row, not the end of the run
            row["status"], row["error"] = "error", f"{type(exc).__name__}: {str(exc)[:400]}"
        done["results"].append(row)
        out.write_text(json.dumps(done, indent=1))
        figures = (f"XLA {row['original_ms']:.3f} ms, kernel {row['generated_ms']:.3f} ms "
                   f"(pipelined {row['original_pipelined_ms']:.3f} / {row['generated_pipelined_ms']:.3f}), "
                   f"diff {row['largest_difference']:.1e}" if row["status"] == "success" else row["error"][:160])
        print(f"{model} {key[0]}/{key[1]}: {figures} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        jax.clear_caches()
    print(f"{len(done['results'])} of {len(chosen)} of {model}'s kernels timed on {device.device_kind}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", type=Path, required=True, help="a JAXBench checkout")
    p.add_argument("--model", action="append", required=True, help="gpt53, gemini3 (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="folder of eval_<model>.json (a rerun resumes)")
    p.add_argument("--budget", type=float, default=float("inf"), help="stop starting kernels after S seconds")
    args = p.parse_args(argv)
    start = time.perf_counter()
    for model in args.model:
        measure(args.suite, model, args.out, args.budget - (time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
