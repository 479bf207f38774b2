"""Log-softmax over whole-row slabs with a LANE-WISE online logsumexp inside the step.

Grid: one "parallel" axis over row blocks of whole (padded) rows. Inside a step:
  1. a lax.fori_loop walks the row in 128-lane column groups keeping, per lane, a running max
     m and running sum l of exp(x - m) as [block_rows, 128] f32 loop carries:
     m_new = max(m, v), l = l * exp(m - m_new) + exp(v - m_new). The loop body is purely
     elementwise: no cross-lane reduction per group;
  2. one cross-lane merge per row: M = max over lanes of m, L = sum over lanes of
     l * exp(m - M), lse = M + log(L);
  3. a second fori_loop over the groups writes x - lse.
The carries start at a large negative finite value (not -inf), so exp(m - m_new) is never
exp(-inf + inf) = nan, even for a lane that so far has seen only padding.

Ragged edges: the wrapper pads d up to a multiple of 128 with -inf (exp(-inf - m) = 0 adds
nothing; those output columns are sliced off). A ragged last row block computes on rows that
are never written back; few rows make one full-dim block.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 128
_LANES = 128
_NEG = -1e30
VMEM_LIMIT_BYTES = 32 << 20


def log_softmax_kernel(x_ref, o_ref):
    br, dp = x_ref.shape
    n = dp // _LANES

    def stats(c, carry):
        m, l = carry
        c0 = pl.multiple_of(c * _LANES, _LANES)
        v = x_ref[:, pl.ds(c0, _LANES)].astype(jnp.float32)
        m_new = jnp.maximum(m, v)
        return m_new, l * jnp.exp(m - m_new) + jnp.exp(v - m_new)

    init = (jnp.full((br, _LANES), _NEG, jnp.float32), jnp.zeros((br, _LANES), jnp.float32))
    m, l = jax.lax.fori_loop(0, n, stats, init)
    row_m = jnp.max(m, axis=1, keepdims=True)                         # [br, 1]
    lse = row_m + jnp.log(jnp.sum(l * jnp.exp(m - row_m), axis=1, keepdims=True))

    def write(c, carry):
        c0 = pl.multiple_of(c * _LANES, _LANES)
        v = x_ref[:, pl.ds(c0, _LANES)].astype(jnp.float32)
        o_ref[:, pl.ds(c0, _LANES)] = (v - lse).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, n, write, 0)


@functools.partial(jax.jit, static_argnames=("br",))
def _log_softmax_2d(x, *, br):
    rows, d = x.shape
    dp = pl.cdiv(d, _LANES) * _LANES
    xp = jnp.pad(x, ((0, 0), (0, dp - d)), constant_values=-jnp.inf) if dp != d else x
    spec = pl.BlockSpec((br, dp), lambda i: (i, 0))
    out = pl.pallas_call(
        log_softmax_kernel,
        grid=(pl.cdiv(rows, br),),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((rows, dp), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(xp)
    return out[:, :d] if dp != d else out


def kernel(x):
    d = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    sublane = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)  # 8 rows for f32, 16 for bf16
    cap = max(sublane, BLOCK_ROWS // sublane * sublane)
    out = _log_softmax_2d(x.reshape(rows, d), br=rows if rows <= cap else cap)
    return out.reshape(x.shape)
