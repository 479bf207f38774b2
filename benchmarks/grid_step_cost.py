"""What a Pallas kernel's grid step, each of its DMAs and its vector work cost beside its bytes
and its MXU work: a measurement for the kernel side of the speed prediction
(evaluator/performance/prediction.py, `kernel_time`; docs/performance-model.md, "What a grid step
and a DMA cost" and "What vector work costs, and the v5e's own constants").

    python benchmarks/grid_step_cost.py measure [--out F.jsonl]       # on a TPU host
    python benchmarks/grid_step_cost.py fit ROWS.jsonl [--out F.json]  # anywhere

Small kernels written here, each timed as jaxbench_timings.py times (`call_timings`, the
back-to-back figure is the one to read):
- steps alone: a (8, 128) float32 block that never changes index, added to at every step;
- reads alone: blocks streamed in and summed into one resident (8, 128) output;
- writes alone: one resident input block written out to every block of the output;
- vector work: a multiply-add, an exp, or a softmax over the rows (an attention kernel's vector
  work: max, subtract, exp, sum, scale), looped over a resident block, from one vector register
  (8, 128) to a block far larger than the register file: the VPU's and EUP's rates, and what
  loads and stores of a block that does not fit cost them;
- tiled matmuls: out = x @ w over (bm, K) x (K, bn) blocks, float32 with small K (the output's
  writes and w's re-reads bound it, as in JAXBench's tall-skinny and small-K matmuls), and
  bfloat16 with the contraction in the grid (the MXU bound) at several block sizes.
Each row names the family and its parameters; `kernels()` rebuilds each kernel, so the speed
model's counts of it (grid steps, HBM bytes, MXU and vector FLOPs) can be traced anywhere. `fit`
fits the kernel side of the compiled path's constants (grid step, DMA and MXU efficiency, the
vector units' rate: fit.KERNEL_SIDE) to one chip's rows and writes them with the rest as in use:
the start of a generation's own calibration file, whose other constants
benchmarks/perf_agreement.py --measured --fit refits on model-written kernels.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STREAM_ROWS, STREAM_COLS = 8192, 8192  # float32: 256 MiB streamed by the reads and the writes
STREAM_BLOCKS = [(8, 128), (8, 512), (32, 512), (128, 512), (256, 1024), (512, 2048)]
STEPS_ALONE = 65536
SMALL_K = (64, 256)
SMALL_K_SIZE = 8192  # M = N
SMALL_K_BLOCKS = [(128, 128), (256, 256), (512, 512), (128, 1024), (1024, 128), (1024, 1024)]
MXU_SIZE = 4096  # M = N = K, bfloat16
VECTOR_BLOCK, VECTOR_STEPS, VECTOR_ITERS = (512, 1024), 256, 64  # resident float32 block, no DMA
# Blocks for the vector rates, one register to 512: each loops VECTOR_ITERS x (VECTOR_BLOCK's
# elements / its own) times, so every row does the same work.
VECTOR_BLOCKS = [(8, 128), (64, 128), (256, 128), (128, 512), (512, 1024)]
VECTOR_OPS = ("fma", "exp", "softmax")
MXU_BLOCKS = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 2048), (1024, 1024, 1024)]


def _params(dims: int) -> Any:
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("arbitrary",) * dims, vmem_limit_bytes=100 << 20)


def steps_alone() -> tuple[Callable, list[Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

        o_ref[...] += 1.0

    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    fn = jax.jit(lambda x: pl.pallas_call(body, grid=(STEPS_ALONE,), in_specs=[spec], out_specs=spec,
                                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          compiler_params=_params(1))(x))
    return fn, [jnp.zeros((8, 128), jnp.float32)]


def reads(block: tuple[int, int]) -> tuple[Callable, list[Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        x = x_ref[...]
        o_ref[...] += x.reshape(-1, 8, x.shape[-1]).sum(axis=0)[:, :128]

    grid = (STREAM_ROWS // block[0], STREAM_COLS // block[1])
    fn = jax.jit(lambda x: pl.pallas_call(
        body, grid=grid, in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype), compiler_params=_params(2))(x))
    return fn, [jnp.ones((STREAM_ROWS, STREAM_COLS), jnp.float32)]


def writes(block: tuple[int, int]) -> tuple[Callable, list[Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(1).astype(jnp.float32)

    grid = (STREAM_ROWS // block[0], STREAM_COLS // block[1])
    fn = jax.jit(lambda x: pl.pallas_call(
        body, grid=grid, in_specs=[pl.BlockSpec(block, lambda i, j: (0, 0))],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((STREAM_ROWS, STREAM_COLS), x.dtype), compiler_params=_params(2))(x))
    return fn, [jnp.ones(block, jnp.float32)]


def small_k_matmul(k: int, block: tuple[int, int]) -> tuple[Callable, list[Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    bm, bn = block
    n = SMALL_K_SIZE
    fn = jax.jit(lambda x, w: pl.pallas_call(
        body, grid=(n // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32), compiler_params=_params(2))(x, w))
    key = jax.random.key(0)
    return fn, [jax.random.normal(key, (n, k), jnp.float32), jax.random.normal(key, (k, n), jnp.float32)]


def mxu_matmul(block: tuple[int, int, int]) -> tuple[Callable, list[Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, w_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    bm, bn, bk = block
    n = MXU_SIZE
    fn = jax.jit(lambda x, w: pl.pallas_call(
        body, grid=(n // bm, n // bn, n // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.bfloat16),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)], compiler_params=_params(3))(x, w))
    key = jax.random.key(0)
    return fn, [jax.random.normal(key, (n, n), jnp.bfloat16)] * 2


def _softmax_rows(x: Any) -> Any:
    import jax.numpy as jnp

    p = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return p * (1.0 / jnp.sum(p, axis=-1, keepdims=True))


def vector_work(op: str, block: tuple[int, int] = VECTOR_BLOCK) -> tuple[Callable, list[Any]]:
    """`op` ("fma": x * a + b, "exp", "softmax": over each row) applied to a resident float32
    block at each step, VECTOR_ITERS times for VECTOR_BLOCK and proportionally more for a
    smaller block: the vector units' (or the transcendental unit's) rate, no DMA in the way."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    step = {"fma": lambda x: x * 0.999 + 0.001, "exp": lambda x: jnp.exp(x) - 1.0, "softmax": _softmax_rows}[op]
    iterations = VECTOR_ITERS * (VECTOR_BLOCK[0] * VECTOR_BLOCK[1]) // (block[0] * block[1])

    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

        o_ref[...] = jax.lax.fori_loop(0, iterations, lambda i, x: step(x), o_ref[...], unroll=8)

    spec = pl.BlockSpec(block, lambda i: (0, 0))
    fn = jax.jit(lambda x: pl.pallas_call(body, grid=(VECTOR_STEPS,), in_specs=[spec], out_specs=spec,
                                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          compiler_params=_params(1))(x))
    return fn, [jnp.zeros(block, jnp.float32)]


def kernels() -> list[tuple[dict[str, Any], Callable[[], tuple[Callable, list[Any]]]]]:
    """(row fields naming the kernel, a builder of (jitted function, inputs)), in the order timed."""
    out: list[tuple[dict[str, Any], Callable[[], tuple[Callable, list[Any]]]]] = [
        ({"family": "steps alone", "steps": STEPS_ALONE}, steps_alone)]
    out += [({"family": "reads", "block": list(b)}, lambda b=b: reads(b)) for b in STREAM_BLOCKS]
    out += [({"family": "writes", "block": list(b)}, lambda b=b: writes(b)) for b in STREAM_BLOCKS]
    out += [({"family": "small-K f32 matmul", "k": k, "block": list(b)}, lambda k=k, b=b: small_k_matmul(k, b))
            for k in SMALL_K for b in SMALL_K_BLOCKS]
    out += [({"family": "bf16 matmul", "block": list(b)}, lambda b=b: mxu_matmul(b)) for b in MXU_BLOCKS]
    out += [({"family": f"vector {op}", "block": list(b)}, lambda op=op, b=b: vector_work(op, b))
            for op in VECTOR_OPS for b in VECTOR_BLOCKS]
    return out


def _kernel_work(fn: Callable, inputs: list[Any], gen: Any) -> Any:
    """The speed model's counts of the one kernel in fn(*inputs), traced (never run)."""
    import jax

    from evaluator.analysis.jaxpr_analysis import summarize
    from evaluator.performance.perf_model import kernel_estimate
    from evaluator.performance.prediction import KernelWork

    (call,) = summarize(jax.make_jaxpr(fn)(*inputs), traffic=True).pallas_calls
    return KernelWork.of(kernel_estimate(call, gen))


def samples_of(rows: list[dict[str, Any]], gen: Any) -> list[Any]:
    """The rows of kernels this script builds, as samples of their back-to-back time (no host
    wait between calls) with the speed model's counts of each."""
    import json

    from evaluator.performance.fit import Sample
    from evaluator.performance.prediction import CaseInputs
    from evaluator.performance.xla_cost import ReferenceWork

    builders = {json.dumps(fields, sort_keys=True): build for fields, build in kernels()}
    samples = []
    for r in rows:
        fields = {k: v for k, v in r.items() if k not in ("device_kind", "median_ms", "pipelined_ms")}
        build = builders.get(json.dumps(fields, sort_keys=True))
        if build is None:
            continue  # a chip's error row, or a kernel this script no longer builds
        samples.append(Sample(" ".join(map(str, fields.values())), "microbenchmark", CaseInputs(
            [_kernel_work(*build(), gen)], 0.0, 0.0, 0.0, ReferenceWork(0.0, 0.0, 0), 0.0, None, "a microbenchmark"),
            kernel_s=r["pipelined_ms"] / 1e3, device_timed=True))
    return samples


def fit_rows(path: Path, out: Path | None = None) -> int:
    import dataclasses
    import json

    from tpu_timings import generation_of

    from evaluator.performance import calibration as calib
    from evaluator.performance.fit import KERNEL_SIDE, agreement, fit
    from evaluator.performance.hardware import GENERATIONS
    from evaluator.performance.prediction import kernel_time

    if not path.is_file():
        raise SystemExit(f"{path}: no such file (grid_step_cost.py measure --out writes one on a TPU host)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kinds = {r["device_kind"] for r in rows}
    if len(kinds) != 1:
        raise SystemExit(f"{path} holds timings of {len(kinds)} kinds of chip: one at a time")
    gen = GENERATIONS[generation_of(kinds.pop())]
    samples = samples_of(rows, gen)
    in_use = calib.load(compiled=True, generation=gen.name)
    fitted = fit(samples, gen, in_use, KERNEL_SIDE, fitted_on=f"{len(samples)} microbenchmarks on {gen.name}")
    print(f"{'kernel':<40}{'steps':>8}{'MiB':>8}{'GFLOP':>8}{'vector':>8}{'ms':>9}   predicted / measured: fitted, in use")
    for s in samples:
        (work,) = s.inputs.kernels
        ratios = [kernel_time(s.inputs, gen, dataclasses.replace(c, dispatch_s=0.0))[0] / s.kernel_s
                  for c in (fitted, in_use)]
        print(f"{s.name:<40}{work.grid_steps:>8.0f}{work.hbm_bytes / 2**20:>8.0f}{work.flops / 1e9:>8.1f}"
              f"{work.vector_flops / max(work.flops, 1):>8.0%}{s.kernel_s * 1e3:>9.3f}{ratios[0]:>14.2f}{ratios[1]:>8.2f}")
    for label, c in (("fitted", fitted), (f"in use ({in_use.fitted_on})", in_use)):
        c = dataclasses.replace(c, dispatch_s=0.0)
        a = agreement([kernel_time(s.inputs, gen, c)[0] for s in samples], [s.kernel_s for s in samples])
        print(f"{label}: " + ", ".join(f"{name} {getattr(c, name):.3g}" for name in KERNEL_SIDE)
              + f"; within 2x {a.within_2x:.0%} of {a.n}, median ratio {a.median_ratio:.2f}")
    if out:
        calib.save(dataclasses.replace(in_use, **{name: getattr(fitted, name) for name in KERNEL_SIDE},
                                       fitted_on=f"kernel side: {fitted.fitted_on}; the rest: {in_use.fitted_on}"), out)
        print(f"wrote {out}")
    return 0


def measure(out: Path | None) -> int:
    import jax

    from jaxbench_timings import call_timings
    from tpu_timings import this_chip, write_rows

    kind, _ = this_chip()
    print(f"{kind}, jax {jax.__version__}")
    rows = []
    for fields, build in kernels():
        fn, inputs = build()
        try:
            t = call_timings(fn, inputs)
        except Exception as e:  # noqa: BLE001 - a kernel the chip refuses is a row too
            rows.append({"device_kind": kind, **fields, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"{fields}: {rows[-1]['error']}", flush=True)
            continue
        rows.append({"device_kind": kind, **fields, "median_ms": t["median_ms"], "pipelined_ms": t["pipelined_ms"]})
        print(f"{fields}: {t['median_ms']:.3f} ms, back to back {t['pipelined_ms']:.3f} ms", flush=True)
    write_rows(out, rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="on a TPU host: time every kernel")
    m.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    f = sub.add_parser("fit", help="fit the kernel-side constants to one chip's rows")
    f.add_argument("rows", type=Path, help="JSON lines that measure wrote")
    f.add_argument("--out", type=Path, help="write the constants in use with this kernel side here")
    args = parser.parse_args(argv)
    return measure(args.out) if args.command == "measure" else fit_rows(args.rows, args.out)


if __name__ == "__main__":
    sys.exit(main())
