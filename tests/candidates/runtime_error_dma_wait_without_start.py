"""A kernel that waits on a DMA it never started: deadlocks (on a TPU and in interpret mode).
Otherwise a real matmul, so nothing before the run stage can tell."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def deadlock_kernel(x_ref, y_ref, x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8), :], buf, sem)
    copy.wait()  # .start() was never called
    acc = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = (acc + 0.0 * buf[0:1, 0:1].astype(jnp.float32)).astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        deadlock_kernel,
        grid=(pl.cdiv(m, 128), pl.cdiv(n, 128)),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, 128), lambda i, j: (0, j)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((8, k), x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x, y, x)
