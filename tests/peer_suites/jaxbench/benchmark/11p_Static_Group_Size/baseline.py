"""Grouped matmul whose create_inputs returns a Python int (a static size), as JAXBench's 11p
does: a kernel with a positional array signature cannot take it, so this one does not load."""
import jax
import jax.numpy as jnp

CONFIG = {'name': 'fixture_static_group', 'model': 'MoE', 'operator': 'gmm', 'M': 4096, 'K': 1024,
          'N': 1024, 'G': 8}


def create_inputs(dtype=jnp.bfloat16):
    key = jax.random.key(42)
    k1, k2 = jax.random.split(key)
    lhs = jax.random.normal(k1, (CONFIG['M'], CONFIG['K']), dtype=dtype)
    rhs = jax.random.normal(k2, (CONFIG['G'], CONFIG['K'], CONFIG['N']), dtype=dtype)
    return lhs, rhs, CONFIG['M'] // CONFIG['G']


def workload(lhs, rhs, group_size):
    groups = lhs.reshape(-1, group_size, lhs.shape[1])
    return jnp.einsum('gmk,gkn->gmn', groups, rhs).reshape(lhs.shape[0], -1)


def benchmark(num_warmup=2, num_iters=10):
    return {'name': CONFIG['name'], 'status': 'skipped'}


if __name__ == '__main__':
    import json
    print(json.dumps(benchmark()))
