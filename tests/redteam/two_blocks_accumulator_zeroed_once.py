"""Bug that needs two blocks: the f32 accumulator is zeroed only at grid step (0, 0, 0), so every
later output tile starts from the previous tile's sums. With 1024-wide tiles every check case is
one tile; the coverage cases (two tiles along M, N or K) expose it.
task: matmul  expect: wrong_output"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TILE = 1024


def _tile(dim):
    return min(TILE, -(-dim // 128) * 128)


def mm_body(x_ref, y_ref, o_ref, acc_ref):
    first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0) & (pl.program_id(2) == 0)

    @pl.when(first)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _out():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    tm, tn, tk = _tile(m), _tile(n), _tile(k)
    mp, np_, kp = -(-m // tm) * tm, -(-n // tn) * tn, -(-k // tk) * tk
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        mm_body, grid=(mp // tm, np_ // tn, kp // tk),
        in_specs=[pl.BlockSpec((tm, tk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((tk, tn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), x.dtype),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=64 << 20),
    )(xp, yp)
    return out[:m, :n]
