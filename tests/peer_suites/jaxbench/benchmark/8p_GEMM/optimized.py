"""Tiled Pallas GEMM with block sizes tuned for v6e. Fixture in JAXBench's optimized.py format:
the kernel, TUNED_PARAMS, create_inputs, workload, and the benchmark harness with its own
module-level `import time`."""
import functools
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.megablox import common

CONFIG = {
    'name': 'fixture_pallas_gemm',
    'model': 'Llama-style',
    'operator': 'pallas_matmul',
    'M': 8192,
    'K': 8192,
    'N': 28672,
    'atol': 1e-3,
    'rtol': 1e-2,
}

TUNED_PARAMS = {'block_shape': [1024, 2048], 'block_k': 1024}


def _gemm_body(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=["block_shape", "block_k"])
def gemm(a, b, *, block_shape, block_k):
    common.assert_is_supported_dtype(a.dtype)
    bm, bn = block_shape
    m, k = a.shape
    _, n = b.shape
    return pl.pallas_call(
        _gemm_body,
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(m // bm, n // bn, k // block_k),
            in_specs=[pl.BlockSpec((bm, block_k), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((block_k, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(a, b)


def get_flops():
    return 2 * CONFIG['M'] * CONFIG['K'] * CONFIG['N']


def create_inputs(dtype=jnp.bfloat16):
    key = jax.random.key(42)
    k1, k2 = jax.random.split(key, 2)
    A = jax.random.normal(k1, (CONFIG['M'], CONFIG['K']), dtype=dtype)
    B = jax.random.normal(k2, (CONFIG['K'], CONFIG['N']), dtype=dtype) * 0.02
    return A, B


def workload(A, B):
    return gemm(A, B, block_shape=tuple(TUNED_PARAMS['block_shape']), block_k=TUNED_PARAMS['block_k'])


def benchmark(num_warmup=5, num_iters=100):
    inputs = create_inputs()
    fn = jax.jit(workload)
    for _ in range(num_warmup):
        fn(*inputs).block_until_ready()
    times = []
    for _ in range(num_iters):
        t0 = time.perf_counter()
        fn(*inputs).block_until_ready()
        times.append((time.perf_counter() - t0) * 1000)
    return {'name': CONFIG['name'], 'time_ms': sum(times) / len(times), 'tflops': get_flops() / 1e9,
            'status': 'success'}


if __name__ == '__main__':
    import json
    print(json.dumps(benchmark()))
