"""rms_norm, another style: the scale stays a rank-1 [d] block, row blocks are addressed
through `//` in the index map, and the mean is taken as a sum times 1/d. Rank-1 blocks and
`//` make the Pallas lowering ask which TPU it targets: this must lower without a TPU."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 32


def rms_kernel(x_ref, s_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)  # [rows, d]
    inv_d = 1.0 / x.shape[-1]
    r = jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) * inv_d + 1e-6)
    o_ref[...] = (x * r * s_ref[...].astype(jnp.float32)[None, :]).astype(o_ref.dtype)


def kernel(x, scale):
    shape = x.shape
    d = shape[-1]
    x2 = x.reshape(-1, d)
    rows = x2.shape[0]
    block = rows if rows < ROWS else ROWS
    steps = pl.cdiv(rows, block)
    out = pl.pallas_call(
        rms_kernel,
        grid=(2 * steps,),  # every block is visited twice in a row: index (2r // 2, 2r+1 // 2)
        in_specs=[pl.BlockSpec((block, d), lambda r: (r // 2, 0)),
                  pl.BlockSpec((d,), lambda r: (0,))],
        out_specs=pl.BlockSpec((block, d), lambda r: (r // 2, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, d), x.dtype),
    )(x2, scale)
    return out.reshape(shape)
