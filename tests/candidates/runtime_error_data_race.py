"""A data race: the kernel reads its VMEM buffer while the DMA that fills it is still in flight.
task: softmax  expect: runtime_error"""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


ROWS = 8


def softmax_kernel(x_hbm, o_ref, buf, sem):
    rows = pl.ds(pl.multiple_of(pl.program_id(0) * ROWS, ROWS), ROWS)
    copy = pltpu.make_async_copy(x_hbm.at[rows], buf, sem)
    copy.start()
    early = buf[...]  # races with the copy: nothing orders this read after the DMA's write
    copy.wait()
    x = buf[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    out = e / jnp.sum(e, axis=-1, keepdims=True)
    o_ref[...] = jnp.where(jnp.isnan(early), out, out).astype(o_ref.dtype)


def kernel(x):
    flat = x.reshape(-1, x.shape[-1])
    n, d = flat.shape
    out = pl.pallas_call(
        softmax_kernel,
        grid=(n // ROWS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((ROWS, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(flat.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((ROWS, d), x.dtype), pltpu.SemaphoreType.DMA(())],
    )(flat)
    return out.reshape(x.shape)
# task: softmax  expect: runtime_error
