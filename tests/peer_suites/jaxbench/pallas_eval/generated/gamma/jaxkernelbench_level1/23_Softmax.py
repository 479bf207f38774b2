"""
Level 1 - Task 23: Softmax (fixture: alpha's correct answer with two bugs a model makes: `jnp`
used but never imported, and a column block of 2000, not a multiple of 128).
"""

import jax
from jax.experimental import pallas as pl

ROWS, COLS, LANES = 256, 2000, 128


def _stats_kernel(x_ref, m_ref, l_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, m_ref.dtype)
        l_ref[...] = jnp.zeros(l_ref.shape, l_ref.dtype)

    x = x_ref[...]
    m_old = m_ref[:, :1]
    m_new = jnp.maximum(m_old, jnp.max(x, axis=1, keepdims=True))
    l_new = l_ref[:, :1] * jnp.exp(m_old - m_new) + jnp.sum(jnp.exp(x - m_new), axis=1, keepdims=True)
    m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
    l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)


def _normalize_kernel(x_ref, m_ref, l_ref, o_ref):
    o_ref[...] = jnp.exp(x_ref[...] - m_ref[:, :1]) / l_ref[:, :1]


class Model:
    def __init__(self):
        pass

    def forward(self, x):
        b, d = x.shape
        rows, cols = min(ROWS, b), min(COLS, d)
        grid = (b // rows, d // cols)
        x_spec = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
        stat_spec = pl.BlockSpec((rows, LANES), lambda i, j: (i, 0))
        stat = jax.ShapeDtypeStruct((b, LANES), jnp.float32)
        m, l = pl.pallas_call(_stats_kernel, grid=grid, in_specs=[x_spec],
                              out_specs=[stat_spec, stat_spec], out_shape=[stat, stat])(x)
        return pl.pallas_call(_normalize_kernel, grid=grid, in_specs=[x_spec, stat_spec, stat_spec],
                              out_specs=x_spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, m, l)


batch_size = 4096
dim = 393216


def get_inputs():
    key = jax.random.PRNGKey(0)
    return [jax.random.uniform(key, shape=(batch_size, dim))]


def get_init_inputs():
    return []
