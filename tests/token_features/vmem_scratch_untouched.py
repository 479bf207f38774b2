"""matmul_int8_scaled with the whole K dimension in one block, so no accumulator is needed, and
an 8x128 VMEM scratch buffer declared and never touched: vmem_scratch declared, not used."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _body(x_ref, sx_ref, w_ref, sw_ref, o_ref, unused_ref):
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32).astype(jnp.float32)
    o_ref[...] = (acc * sx_ref[...].astype(jnp.float32) * sw_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def kernel(x, sx, w, sw):
    m, k = x.shape
    n = w.shape[1]
    bm, bn = min(m, 256), min(n, 256)
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)), pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), sx.dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x, sx.reshape(m, 1), w, sw.reshape(1, n))
