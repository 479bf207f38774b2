"""Bug that needs two blocks: the K loop overwrites the f32 accumulator with each K block's
product instead of adding to it, so only the last K block counts. Every check case has K within
one 1024-wide block; the coverage case with two K blocks and a tail exposes it.
task: batched_matmul  expect: wrong_output"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _fit(dim, target, align):
    return min(target, -(-dim // align) * align)


def bmm_block(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(3) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(3) == pl.num_programs(3) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(a, b):
    batch, m, k = a.shape
    n = b.shape[2]
    tm, tn, tk = _fit(m, 512, 8), _fit(n, 512, 128), _fit(k, 1024, 128)
    mp, np_, kp = -(-m // tm) * tm, -(-n // tn) * tn, -(-k // tk) * tk
    a = jnp.pad(a, ((0, 0), (0, mp - m), (0, kp - k)))
    b = jnp.pad(b, ((0, 0), (0, kp - k), (0, np_ - n)))
    sq = pl.squeezed
    out = pl.pallas_call(
        bmm_block, grid=(batch, mp // tm, np_ // tn, kp // tk),
        in_specs=[pl.BlockSpec((sq, tm, tk), lambda g, i, j, kk: (g, i, kk)),
                  pl.BlockSpec((sq, tk, tn), lambda g, i, j, kk: (g, kk, j))],
        out_specs=pl.BlockSpec((sq, tm, tn), lambda g, i, j, kk: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, mp, np_), a.dtype),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=64 << 20),
    )(a, b)
    return out[:, :m, :n]
