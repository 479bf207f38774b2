"""How long the MXU takes over a narrow attention head: the measurement behind the speed model's
tile padding (evaluator/analysis/jaxpr_cost.py, `dot_tile_padding`).

    python benchmarks/mxu_padding.py [--out F.jsonl]    # on a TPU host

A Pallas kernel computes (q k^T) v at each of 256 grid steps, q (512, d) against k and v (2048, d)
in bfloat16, at head widths d from 32 to 512, and XLA's own 8192-cube bfloat16 matmul beside it,
each timed as jaxbench_timings.py times (`call_timings`). Prints, and writes as JSON lines, the
time and the FLOP rate at the nominal FLOPs (4 * 512 * 2048 * d a step) as a share of the
generation's peak. If the MXU runs the contraction of q k^T and the output lanes of p v in whole
128-wide tiles, d = 32, 64 and 128 take about the same time and d = 256 twice it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS, QUERIES, KEYS = 256, 512, 2048
HEAD_DIMS = (32, 64, 128, 256, 512)
XLA_CUBE = 8192


def attention_kernel(head_dim: int):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(q_ref, k_ref, v_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        o_ref[...] = jnp.dot(s.astype(jnp.bfloat16), v_ref[...],
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)

    def spec(rows: int):
        return pl.BlockSpec((None, rows, head_dim), lambda i: (i, 0, 0))

    return jax.jit(lambda q, k, v: pl.pallas_call(
        body, grid=(STEPS,), in_specs=[spec(QUERIES), spec(KEYS), spec(KEYS)], out_specs=spec(QUERIES),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=96 << 20))(q, k, v))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from jaxbench_timings import call_timings
    from tpu_timings import this_chip, write_rows

    kind, gen = this_chip()
    key = jax.random.key(0)
    programs = []
    for d in HEAD_DIMS:
        q = jax.random.normal(key, (STEPS, QUERIES, d), jnp.bfloat16)
        kv = jax.random.normal(key, (STEPS, KEYS, d), jnp.bfloat16)
        programs.append((f"pallas (q k^T) v, d={d}", d, 4.0 * STEPS * QUERIES * KEYS * d,
                         attention_kernel(d), [q, kv, kv]))
    x = jax.random.normal(key, (XLA_CUBE, XLA_CUBE), jnp.bfloat16)
    programs.append(("xla matmul 8192^3", None, 2.0 * XLA_CUBE ** 3, jax.jit(jnp.dot), [x, x]))
    print(f"{kind}, jax {jax.__version__}: peak {gen.bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16")
    print(f"{'program':<28}{'GFLOP':>8}{'median ms':>11}{'b2b ms':>9}{'share':>7}")
    rows = []
    for name, head_dim, flops, fn, inputs in programs:
        t = call_timings(fn, inputs)
        row = {"device_kind": kind, "program": name, "head_dim": head_dim, "flops": flops,
               "median_ms": t["median_ms"], "pipelined_ms": t["pipelined_ms"],
               "share_of_peak": flops / (t["pipelined_ms"] / 1e3) / gen.bf16_flops_per_s}
        rows.append(row)
        print(f"{name:<28}{flops / 1e9:>8.1f}{row['median_ms']:>11.3f}{row['pipelined_ms']:>9.3f}"
              f"{row['share_of_peak']:>7.2f}", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
