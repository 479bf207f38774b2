"""A DMA started and never waited: softmax over row blocks, each block's rows copied in from HBM
chunk by chunk with double buffering, the next chunk's copy started before this chunk's rows are
used. The prefetch guard reads `c + 1 <= n` for `c + 1 < n`, and the row index is clamped, so the
last step starts one more copy of the last chunk that nothing waits on. Every value is right;
on a TPU that copy is still writing the buffer when the kernel returns.
task: softmax  expect: runtime_error"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 128   # rows per grid step (the output block)
CHUNK = 32    # rows per in-kernel copy


def softmax_kernel(x_hbm, o_ref, buf, sems):
    n = BLOCK // CHUNK
    first = pl.program_id(0) * BLOCK

    def copy(c, slot):
        row = pl.multiple_of(first + jnp.minimum(c, n - 1) * CHUNK, CHUNK)
        return pltpu.make_async_copy(x_hbm.at[pl.ds(row, CHUNK)], buf.at[slot], sems.at[slot])

    def body(c, carry):
        slot = c % 2

        @pl.when(c + 1 <= n)  # one step too far: the last step prefetches a chunk nobody waits on
        def _prefetch():
            copy(c + 1, 1 - slot).start()

        copy(c, slot).wait()
        x = buf[slot].astype(jnp.float32)
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        rows = pl.ds(pl.multiple_of(c * CHUNK, CHUNK), CHUNK)
        o_ref[rows, :] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)
        return carry

    copy(0, 0).start()
    lax.fori_loop(0, n, body, 0)


def kernel(x):
    flat = x.reshape(-1, x.shape[-1])
    rows, d = flat.shape
    padded = pl.cdiv(rows, BLOCK) * BLOCK
    flat = jnp.pad(flat, ((0, padded - rows), (0, 0)))
    out = pl.pallas_call(
        softmax_kernel,
        grid=(padded // BLOCK,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((BLOCK, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((padded, d), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, CHUNK, d), x.dtype), pltpu.SemaphoreType.DMA((2,))],
    )(flat)
    return out[:rows].reshape(x.shape)
