"""How fast a Pallas kernel streams HBM on this chip, by block shape: the measured figure behind
the speed model's DMA efficiency (one fitted `hbm_efficiency` today, whatever the block).

    python benchmarks/dma_bandwidth.py [--out F.jsonl]    # on a TPU host

A copy kernel (out = x * 2) over a 256 MiB float32 array, once per block shape from one
(8, 128) tile to 4 MiB blocks, wide and tall, and XLA's own x * 2 beside them, each timed as
jaxbench_timings.py times (`call_timings`: the grader's `time_callable`, 3 warm-up calls, then
20, each to block_until_ready, of which the median is kept, and 20 calls back to back waited on
once). Prints, and writes as JSON lines, the block's bytes, the grid steps, the time and the
HBM bandwidth moved (read + write) as a share of the generation's peak.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS, COLS = 8192, 8192  # float32: 256 MiB
BLOCKS = [(8, 128), (8, 512), (8, 8192), (32, 512), (64, 1024), (128, 128), (512, 128), (2048, 128),
          (128, 1024), (256, 1024), (256, 2048), (512, 1024), (512, 2048), (1024, 1024)]


def copy_kernel(block: tuple[int, int]):
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return jax.jit(lambda x: pl.pallas_call(
        body, grid=(ROWS // block[0], COLS // block[1]), in_specs=[spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=64 << 20))(x))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from jaxbench_timings import call_timings
    from tpu_timings import this_chip, write_rows

    kind, gen = this_chip()
    x = jnp.ones((ROWS, COLS), jnp.float32)
    moved = 2 * x.nbytes
    programs = [("xla", None, jax.jit(lambda x: x * 2))] + [
        (f"pallas {b[0]}x{b[1]}", b, copy_kernel(b)) for b in BLOCKS]
    rows = []
    print(f"{kind}, jax {jax.__version__}: {moved / 2**20:.0f} MiB moved per call, peak "
          f"{gen.hbm_bytes_per_s / 1e9:.0f} GB/s")
    print(f"{'program':<20}{'block KiB':>10}{'steps':>8}{'median ms':>11}{'b2b ms':>9}{'share':>7}")
    for name, block, fn in programs:
        t = call_timings(fn, [x])
        row = {"device_kind": kind, "program": name, "block": block,
               "block_bytes": block[0] * block[1] * 4 if block else None,
               "grid_steps": ROWS // block[0] * (COLS // block[1]) if block else None,
               "median_ms": t["median_ms"], "pipelined_ms": t["pipelined_ms"],
               "share_of_peak": moved / (t["pipelined_ms"] / 1e3) / gen.hbm_bytes_per_s}
        rows.append(row)
        print(f"{name:<20}{(row['block_bytes'] or 0) / 1024:>10.0f}{row['grid_steps'] or 1:>8}"
              f"{row['median_ms']:>11.3f}{row['pipelined_ms']:>9.3f}{row['share_of_peak']:>7.2f}", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
