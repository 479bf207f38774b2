"""linear_recurrence as recurrentgemma's RG-LRU scan is written: one time step per loop iteration.

Grid (batch, channel blocks, time chunks), the time axis last and "arbitrary": the state
h [N, Dt] (float32, VMEM scratch) carries from one chunk to the next and is zeroed at the
first. Inside a chunk a fori_loop walks the time steps one by one: it loads the rows x_t and
a_t ([1, Dt]) and the columns b_t and c_t ([N, 1]: b and c arrive as [B, T, N, 1] so a step
is a leading-axis index), updates h = a_t * h + b_t x_t and stores y_t = sum_n c_t[n] h[n]
as one row of y. Inputs are cast to float32 in the wrapper (single-row dynamic loads of packed
bf16 are not what this kernel is about), y comes back in float32 and is cast at the end.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK_T = 256   # time steps per grid step
BLOCK_D = 128   # channels per block (lanes)


def step_scan_kernel(x_ref, a_ref, b_ref, c_ref, y_ref, h_ref):
    @pl.when(pl.program_id(2) == 0)
    def _zero_state():
        h_ref[...] = jnp.zeros_like(h_ref)

    def step(t, h):
        x_t = x_ref[pl.ds(t, 1), :]          # [1, Dt]
        a_t = a_ref[pl.ds(t, 1), :]
        h = a_t * h + b_ref[t] * x_t         # [N, 1] * [1, Dt] -> [N, Dt]
        y_ref[pl.ds(t, 1), :] = jnp.sum(c_ref[t] * h, axis=0, keepdims=True)
        return h

    h_ref[...] = lax.fori_loop(0, x_ref.shape[0], step, h_ref[...])


def kernel(x, a, b, c):
    batch, steps, dim = x.shape
    n = b.shape[-1]
    chunk = min(CHUNK_T, steps)
    block_d = BLOCK_D if dim % BLOCK_D == 0 else dim
    f32 = jnp.float32
    x32, a32 = x.astype(f32), a.astype(f32)
    b_cols, c_cols = b.astype(f32)[..., None], c.astype(f32)[..., None]  # [B, T, N, 1]
    rows = pl.BlockSpec((None, chunk, block_d), lambda i, j, t: (i, t, j))
    cols = pl.BlockSpec((None, chunk, n, 1), lambda i, j, t: (i, t, 0, 0))
    y = pl.pallas_call(
        step_scan_kernel,
        grid=(batch, pl.cdiv(dim, block_d), pl.cdiv(steps, chunk)),
        in_specs=[rows, rows, cols, cols],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((batch, steps, dim), f32),
        scratch_shapes=[pltpu.VMEM((n, block_d), f32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x32, a32, b_cols, c_cols)
    return y.astype(x.dtype)
