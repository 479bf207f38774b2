"""RMSNorm before attention; the workload reads CONFIG for epsilon. Fixture in JAXBench's format."""
import jax
import jax.numpy as jnp
from jax import lax

CONFIG = {
    'name': 'fixture_rmsnorm',
    'model': 'Llama-style',
    'operator': 'rms_norm',
    'batch': 8,
    'seq_len': 4096,
    'emb_dim': 8192,
    'epsilon': 1e-5,
}


def create_inputs(dtype=jnp.bfloat16):
    key = jax.random.key(42)
    k1, k2 = jax.random.split(key, 2)
    x = jax.random.normal(k1, (CONFIG['batch'], CONFIG['seq_len'], CONFIG['emb_dim']), dtype=dtype)
    scale = jax.random.normal(k2, (CONFIG['emb_dim'],), dtype=dtype) * 0.1 + 1.0
    return x, scale


def workload(x, scale):
    x32 = x.astype(jnp.float32)
    inv = lax.rsqrt(jnp.mean(lax.square(x32), axis=-1, keepdims=True) + CONFIG['epsilon'])
    return (x32 * inv).astype(x.dtype) * scale


def get_flops():
    return 5 * CONFIG['batch'] * CONFIG['seq_len'] * CONFIG['emb_dim']


def benchmark(num_warmup=5, num_iters=100):
    import time
    inputs = create_inputs()
    fn = jax.jit(workload)
    out = fn(*inputs)
    out.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(num_iters):
        fn(*inputs).block_until_ready()
    return {'name': CONFIG['name'], 'time_ms': (time.perf_counter() - t0) * 1000 / num_iters}


if __name__ == '__main__':
    import json
    print(json.dumps(benchmark()))
