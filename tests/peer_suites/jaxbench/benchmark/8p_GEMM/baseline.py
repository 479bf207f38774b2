"""GEMM at a Llama-style projection size. Fixture in JAXBench's baseline.py format (written for
pallas-kernel-gym's tests): CONFIG holds the sizes, create_inputs reads them."""
import jax
import jax.numpy as jnp

CONFIG = {
    'name': 'fixture_gemm',
    'model': 'Llama-style',
    'operator': 'matmul',
    'M': 8192,
    'K': 8192,
    'N': 28672,
}


def create_inputs(dtype=jnp.bfloat16):
    """Returns (A, B)."""
    key = jax.random.key(42)
    k1, k2 = jax.random.split(key, 2)
    A = jax.random.normal(k1, (CONFIG['M'], CONFIG['K']), dtype=dtype)
    B = jax.random.normal(k2, (CONFIG['K'], CONFIG['N']), dtype=dtype) * 0.02
    return A, B


def workload(A, B):
    return jnp.matmul(A, B)


def benchmark(num_warmup=5, num_iters=100):
    import time
    inputs = create_inputs()
    fn = jax.jit(workload)
    for _ in range(num_warmup):
        fn(*inputs).block_until_ready()
    times = []
    for _ in range(num_iters):
        t0 = time.perf_counter()
        fn(*inputs).block_until_ready()
        times.append((time.perf_counter() - t0) * 1000)
    import numpy as np
    return {'name': CONFIG['name'], 'time_ms': float(np.mean(times)), 'status': 'success'}


if __name__ == '__main__':
    import json
    print(json.dumps(benchmark()))
