"""Cheat: the paged-attention kernel that does the work fetches its pages through the pipeline
(scalar-prefetched page table read by the index maps, online softmax over one page per grid
step) and starts no DMA; a tiny side pallas_call copies q from HBM into VMEM by a manual DMA,
so "some kernel uses manual_dma". The DMAs must move the task's large operands (the pages).
task: paged_attention  expect: missing_feature"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_BATCHED = (((2,), (2,)), ((0,), (0,)))     # [h, g, d] x [h, t, d] -> [h, g, t]
_BATCHED_PV = (((2,), (1,)), ((0,), (0,)))  # [h, g, t] x [h, t, d] -> [h, g, d]


def _copy_q_body(q_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(q_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


def _copy_q(q4):
    return pl.pallas_call(
        _copy_q_body,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_shape=jax.ShapeDtypeStruct(q4.shape, q4.dtype),
        scratch_shapes=[pltpu.VMEM(q4.shape, q4.dtype), pltpu.SemaphoreType.DMA(())],
    )(q4)


def _attend_body(lens_ref, pages_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                 page_size, scale):
    b, p = pl.program_id(0), pl.program_id(1)

    @pl.when(p == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    k, v = k_ref[...], v_ref[...]  # [hkv, page_size, d]
    s = lax.dot_general(q_ref[...], k, _BATCHED, preferred_element_type=jnp.float32) * scale
    pos = p * page_size + lax.broadcasted_iota(jnp.int32, s.shape, 2)
    s = jnp.where(pos < lens_ref[b], s, -1e30)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    alpha, probs = jnp.exp(m_prev - m_new), jnp.exp(s - m_new)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(probs, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + lax.dot_general(
        probs.astype(v.dtype), v, _BATCHED_PV, preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(p == pl.num_programs(1) - 1)
    def _finish():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def kernel(q, k_pages, v_pages, lengths, page_indices):
    batch, hq, d = q.shape
    hkv, _, page_size, _ = k_pages.shape
    pps = page_indices.shape[1]
    g = hq // hkv
    q4 = _copy_q(q.reshape(batch, hkv, g, d))
    q_spec = pl.BlockSpec((None, hkv, g, d), lambda b, p, lens, pages: (b, 0, 0, 0))
    page_spec = pl.BlockSpec((hkv, None, page_size, d),
                             lambda b, p, lens, pages: (0, pages[b * pps + p], 0, 0))
    out = pl.pallas_call(
        functools.partial(_attend_body, page_size=page_size, scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(batch, pps),
            in_specs=[q_spec, page_spec, page_spec], out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((hkv, g, 1), jnp.float32), pltpu.VMEM((hkv, g, 1), jnp.float32),
                            pltpu.VMEM((hkv, g, d), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(lengths.astype(jnp.int32), page_indices.reshape(-1).astype(jnp.int32), q4, k_pages, v_pages)
    return out.reshape(batch, hq, d)
