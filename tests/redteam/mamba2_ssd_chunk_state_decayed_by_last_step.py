"""State carried across chunks decayed by one step, not by the whole chunk: a chunked Mamba2 SSD
kernel (grid over batch, head blocks and 256-step chunks, the state S[n, p] of each head in a
VMEM scratch) whose intra-chunk part is right (C B^T masked by exp(cum[t] - cum[s]), times dt
and x, on the MXU), whose output term from the entering state is right (exp(cum[t]) C S), and
whose new chunk contribution to the state is right (B^T weighted by exp(cum[T-1] - cum[s]) dt,
times x). Only the old state is carried to the next chunk as exp(dt A) S with the chunk's LAST
step's decay, where the recurrence decays it by every step of the chunk, exp(cum[T-1]): the
per-step update S_t = exp(dt_t A) S_{t-1} + ... written once per chunk instead of once per step.
The first chunk of every sequence is exact, so a sequence shorter than one chunk passes; from
the second chunk on, fast heads keep a fifth of a state they should have forgotten entirely
(exp(-1.6) for a chunk decay that underflows) and slow heads one about 30% too large (0.999 for
exp(-0.256)). The train cases span three chunks.
task: mamba2_ssd  expect: wrong_output"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 256
HEADS = 8
_NT = (((1,), (1,)), ((), ()))


def ssd_kernel(x_ref, dt_ref, a_ref, d_ref, b_ref, c_ref, y_ref, s_ref, *, seq, per_group, headdim):
    hi, ci = pl.program_id(1), pl.program_id(2)
    chunk, hb = x_ref.shape[0], dt_ref.shape[0]
    n = b_ref.shape[2]

    @pl.when(ci == 0)
    def _init():
        s_ref[...] = jnp.zeros_like(s_ref)

    valid = seq - ci * chunk
    dt = jnp.where(lax.broadcasted_iota(jnp.int32, (1, chunk), 1) < valid, dt_ref[...], 0.0)
    x = jnp.where(lax.broadcasted_iota(jnp.int32, (chunk, 1), 0) < valid,
                  x_ref[...].astype(jnp.float32), 0.0)
    b_rows = lax.broadcasted_iota(jnp.int32, (chunk, n), 0) < valid
    causal = (lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
              >= lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1))
    rows = lax.broadcasted_iota(jnp.int32, (hb, 1), 0)
    a_col = jnp.zeros((hb, 1), jnp.float32)
    for j in range(hb):
        a_col = jnp.where(rows == j, a_ref[hi * hb + j], a_col)
    log_a = dt * a_col                                                              # [hb, T]
    cums = lax.dot_general(causal.astype(jnp.float32), log_a, _NT,
                           precision=lax.Precision.HIGHEST)                          # [T, hb]
    eye = (rows == lax.broadcasted_iota(jnp.int32, (1, hb), 1)).astype(jnp.float32)
    cums_t = lax.dot_general(eye, cums, _NT, precision=lax.Precision.HIGHEST)      # [hb, T]
    outs = []
    for j in range(hb):
        head = hi * hb + j
        grp = head // per_group
        cum_col, cum_row = cums[:, j:j + 1], cums_t[j:j + 1, :]
        b = jnp.where(b_rows, b_ref[grp].astype(jnp.float32), 0.0)
        c = c_ref[grp].astype(jnp.bfloat16)
        cb = lax.dot_general(c, b.astype(jnp.bfloat16), _NT, preferred_element_type=jnp.float32)
        m = cb * jnp.exp(jnp.where(causal, cum_col - cum_row, -jnp.inf)) * dt[j:j + 1, :]
        xj = x[:, j * headdim:(j + 1) * headdim].astype(jnp.bfloat16)
        s = s_ref[j]
        y = jnp.dot(m.astype(jnp.bfloat16), xj, preferred_element_type=jnp.float32)
        y = y + jnp.exp(cum_col) * jnp.dot(c, s.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        outs.append(y + d_ref[head] * x[:, j * headdim:(j + 1) * headdim])
        last = cum_row[:, chunk - 1:]
        weight = jnp.exp(last - cum_row) * dt[j:j + 1, :]                           # [1, T]
        new = jnp.dot((b.T * weight).astype(jnp.bfloat16), xj, preferred_element_type=jnp.float32)
        s_ref[j] = jnp.exp(log_a[j:j + 1, chunk - 1:]) * s + new   # one step's decay, not the chunk's
    y_ref[...] = jnp.concatenate(outs, axis=1).astype(y_ref.dtype)


@functools.partial(jax.jit, static_argnames=("chunk", "hb"))
def _ssd(x, dt, A, B, C, D, *, chunk, hb):
    batch, seq, heads, headdim = x.shape
    groups, n = B.shape[2], B.shape[3]
    x2 = x.reshape(batch, seq, heads * headdim)
    dt4 = dt.astype(jnp.float32).transpose(0, 2, 1).reshape(batch, heads // hb, hb, seq)
    bg, cg = B.transpose(0, 2, 1, 3), C.transpose(0, 2, 1, 3)
    x_spec = pl.BlockSpec((None, chunk, hb * headdim), lambda b, h, c: (b, c, h))
    bc_spec = pl.BlockSpec((None, groups, chunk, n), lambda b, h, c: (b, 0, c, 0))
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    y2 = pl.pallas_call(
        functools.partial(ssd_kernel, seq=seq, per_group=heads // groups, headdim=headdim),
        grid=(batch, heads // hb, pl.cdiv(seq, chunk)),
        in_specs=[x_spec, pl.BlockSpec((None, None, hb, chunk), lambda b, h, c: (b, h, 0, c)),
                  smem, smem, bc_spec, bc_spec],
        out_specs=x_spec,
        out_shape=jax.ShapeDtypeStruct(x2.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((hb, n, headdim), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=64 * 1024 * 1024),
    )(x2, dt4, A.astype(jnp.float32), D.astype(jnp.float32), bg, cg)
    return y2.reshape(x.shape)


def kernel(x, dt, A, B, C, D):
    seq, heads, headdim = x.shape[1:]
    unit = 128 // math.gcd(headdim, 128)
    fits = [m for m in range(unit, min(HEADS, heads) + 1, unit) if heads % m == 0]
    hb = max(fits) if heads % unit == 0 and fits else heads
    return _ssd(x, dt, A, B, C, D, chunk=min(CHUNK, -(-seq // 128) * 128), hb=hb)
