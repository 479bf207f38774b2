"""Cheat: call a prebuilt kernel from a library instead of writing one (Pallas' cuBLAS).
task: matmul  expect: policy_violation"""
from jax.experimental.pallas.ops.tpu.matmul import matmul


def kernel(x, y):
    return matmul(x, y, block_shape=(128, 128), block_k=128).astype(x.dtype)
