"""What a Pallas kernel's grid step and each of its DMAs cost beside its bytes and its compute:
a measurement for the kernel side of the speed prediction (evaluator/performance/prediction.py,
`kernel_time`; docs/performance-model.md, "What a grid step and a DMA cost").

    python benchmarks/grid_step_cost.py [--out F.jsonl]    # on a TPU host

Small kernels written here, each timed as jaxbench_timings.py times (`call_timings`, the
back-to-back figure is the one to read):
- steps alone: a (8, 128) float32 block that never changes index, added to at every step;
- reads alone: blocks streamed in and summed into one resident (8, 128) output;
- writes alone: one resident input block written out to every block of the output;
- vector work: a multiply-add, or an exp, looped over a resident block (the VPU's and EUP's rates);
- tiled matmuls: out = x @ w over (bm, K) x (K, bn) blocks, float32 with small K (the output's
  writes and w's re-reads bound it, as in JAXBench's tall-skinny and small-K matmuls), and
  bfloat16 with the contraction in the grid (the MXU bound) at several block sizes.
Each row names the family and its parameters; `kernels()` rebuilds each kernel, so the speed
model's counts of it (grid steps, block copies, HBM bytes, FLOPs) can be traced anywhere.
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


def vector_work(op: str) -> tuple[Callable, list[Any]]:
    """`op` ("fma": x * a + b, "exp") applied VECTOR_ITERS times to a resident block at each
    step: the vector units' (or, for exp, the transcendental unit's) rate, no DMA in the way."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    step = (lambda x: x * 0.999 + 0.001) if op == "fma" else (lambda x: jnp.exp(x) - 1.0)

    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

        o_ref[...] = jax.lax.fori_loop(0, VECTOR_ITERS, lambda i, x: step(x), o_ref[...])

    spec = pl.BlockSpec(VECTOR_BLOCK, lambda i: (0, 0))
    fn = jax.jit(lambda x: pl.pallas_call(body, grid=(VECTOR_STEPS,), in_specs=[spec], out_specs=spec,
                                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          compiler_params=_params(1))(x))
    return fn, [jnp.zeros(VECTOR_BLOCK, jnp.float32)]


def kernels() -> list[tuple[dict[str, Any], Callable[[], tuple[Callable, list[Any]]]]]:
    """(row fields naming the kernel, a builder of (jitted function, inputs)), in the order timed."""
    out: list[tuple[dict[str, Any], Callable[[], tuple[Callable, list[Any]]]]] = [
        ({"family": "steps alone", "steps": STEPS_ALONE}, steps_alone)]
    out += [({"family": "reads", "block": list(b)}, lambda b=b: reads(b)) for b in STREAM_BLOCKS]
    out += [({"family": "writes", "block": list(b)}, lambda b=b: writes(b)) for b in STREAM_BLOCKS]
    out += [({"family": "small-K f32 matmul", "k": k, "block": list(b)}, lambda k=k, b=b: small_k_matmul(k, b))
            for k in SMALL_K for b in SMALL_K_BLOCKS]
    out += [({"family": "bf16 matmul", "block": list(b)}, lambda b=b: mxu_matmul(b)) for b in MXU_BLOCKS]
    out += [({"family": f"vector {op}", "iterations": VECTOR_ITERS}, lambda op=op: vector_work(op))
            for op in ("fma", "exp")]
    return out


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
    parser.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    return measure(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
