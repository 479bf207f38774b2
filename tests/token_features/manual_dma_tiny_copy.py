"""matmul with x also left in HBM (pl.ANY) and one 8x128 tile of it copied by DMA, started and
waited, then ignored; the real work uses the pipelined blocks: manual_dma declared, not used."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

B = 256


def _body(x_ref, y_ref, x_hbm, o_ref, tile_ref, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8), pl.ds(0, 128)], tile_ref, sem)
    copy.start()
    copy.wait()
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    bm, bn = min(m, B), min(n, B)
    return pl.pallas_call(
        _body,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x, y, x)
