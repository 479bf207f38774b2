"""Work on a model's parameters alone (weight folding) is not outside work; work on its inputs is."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from evaluator.analysis.jaxpr_analysis import summarize


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _kernel_on(a):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), interpret=True)(a)




def _outside_flops(fn, first_parameter):
    args = (jax.ShapeDtypeStruct((8, 256), jnp.float32), jax.ShapeDtypeStruct((256, 512), jnp.float32),
            jax.ShapeDtypeStruct((512,), jnp.float32))
    return summarize(jax.make_jaxpr(fn)(*args), first_parameter=first_parameter)


def test_folding_the_weights_is_left_out_and_said():
    def fold_then_kernel(x, w, b):
        return _kernel_on(x * w.sum(1) + b.sum())

    plain = _outside_flops(fold_then_kernel, None)
    declared = _outside_flops(fold_then_kernel, 1)
    assert plain.outside.flops >= 256 * 512  # w.sum(1) counted as outside work
    assert declared.outside.flops < 256 * 512 / 10 and declared.parameter_eqns >= 2
    assert len(declared.pallas_calls) == 1


def test_work_that_reads_an_input_still_counts_and_kernels_on_weights_are_seen():
    def input_outside(x, w, b):
        return _kernel_on(w)[:8, :256] + jnp.exp(x).sum() + (x @ w)[:, :256].sum()

    declared = _outside_flops(input_outside, 1)
    assert declared.outside.heavy_ops  # the matmul reads x: still outside work
    assert declared.outside.flops >= 8 * 256  # exp and the sum over x
    assert len(declared.pallas_calls) == 1  # a kernel on the weights alone is not folded away


def test_inside_a_jit_the_parameters_are_followed():
    @jax.jit
    def inner(x, w, b):
        return _kernel_on(x * w.sum(1) + b.sum())

    declared = _outside_flops(inner, 1)
    assert declared.outside.flops < 256 * 512 / 10 and declared.parameter_eqns >= 2
