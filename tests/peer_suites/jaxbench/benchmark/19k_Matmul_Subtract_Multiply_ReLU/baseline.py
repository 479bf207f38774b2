"""9_Matmul_Subtract_Multiply_ReLU: a KernelBench-derived fused operator. Fixture in JAXBench's
format, with its two known traits: shapes hard-coded in create_inputs (CONFIG is metadata), and
all-zero weight and bias, so the output is relu((0 - 2) * 1.5) = 0 whatever x is."""
import jax
import jax.numpy as jnp

CONFIG = {
    'name': '9_Matmul_Subtract_Multiply_ReLU',
    'batch_size': 4096,
    'in_features': 8192,
    'out_features': 6144,
    'subtract_value': 2.0,
    'multiply_value': 1.5,
}


def create_inputs(dtype=jnp.float32):
    """Create all inputs including weights."""
    key = jax.random.key(0)
    x = jax.random.uniform(key, (4096, 8192), dtype=dtype)
    weight = jnp.zeros((8192, 6144), dtype=dtype)
    bias = jnp.zeros(6144, dtype=dtype)
    return x, weight, bias


def workload(x, weight, bias):
    x = jnp.matmul(x, weight) + bias
    x = x - 2.0
    x = x * 1.5
    return jax.nn.relu(x)


def benchmark(num_warmup=5, num_iters=100):
    import time
    inputs = create_inputs()
    fn = jax.jit(workload)
    for _ in range(num_warmup):
        out = fn(*inputs)
        if hasattr(out, 'block_until_ready'):
            out.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(num_iters):
        fn(*inputs).block_until_ready()
    return {'name': CONFIG['name'], 'time_ms': (time.perf_counter() - t0) * 1000 / num_iters}


if __name__ == '__main__':
    import json
    print(json.dumps(benchmark()))
