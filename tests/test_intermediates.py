"""Intermediates between kernels and heavy math left to XLA (evaluator/analysis/intermediates.py).

Traced only (jax.make_jaxpr, no grading): the analysis and the 2x rule at bench sizes.
"""
import math
import types

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from evaluator.analysis.intermediates import INTERMEDIATE_LIMIT, weigh
from evaluator.analysis.jaxpr_analysis import summarize
from tasks import get_task
from tests.conftest import HONEST, TESTS


def _module(path):
    module = types.ModuleType(path.stem)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def _summary(fn, *specs):
    return summarize(jax.make_jaxpr(fn)(*specs))


def _case_weighed(task_name, path, case_name):
    task = get_task(task_name)
    case = next(c for c in task.cases if c.name == case_name)
    specs = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in task.arg_specs(case)]
    summary = _summary(_module(path).kernel, *specs)
    arrays = [(tuple(a.shape), a.dtype) for a in (*task.arg_specs(case), *task.out_specs(case))]
    return summary, weigh(summary.intermediates, summary.outside_math, arrays, case.name)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _kernel_call(x):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


ATTENTION_CHEAT = TESTS / "redteam" / "attention_softmax_between_kernels.py"


def test_softmax_between_attention_kernels_is_found_with_its_ops():
    q = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.float32)
    summary = _summary(_module(ATTENTION_CHEAT).kernel, q, q, q)
    top = summary.intermediates[0]
    assert (top.producer, top.consumer) == ("scores_kernel", "mix_kernel")
    assert top.shape == [1, 2, 256, 256] and top.dtype == "float32"
    assert top.nbytes == 2 * 256 * 256 * 4
    assert {"exp", "reduce_max", "reduce_sum", "div"} <= set(top.outside_ops)
    assert {"exp", "reduce_sum"} <= {m.op for m in summary.outside_math if m.shape == [1, 2, 256, 256]}


def test_attention_cheat_is_refused_at_bench_size_naming_tensor_and_ops():
    summary, weighed = _case_weighed("attention_fwd", ATTENTION_CHEAT, "train_bench_b4_h16_s4096_d128_bf16")
    assert weighed.ratio >= 4 * INTERMEDIATE_LIMIT  # S / (4 D) = 8, counted at 2 bytes
    assert "[4, 16, 4096, 4096] float32" in weighed.message
    assert "scores_kernel" in weighed.message and "mix_kernel" in weighed.message
    assert "exp" in weighed.message and "fuse" in weighed.message


def test_attention_cheat_at_check_size_is_under_the_limit():
    # S = 256 < 8 x head_dim: the logits are smaller than q, k, v and o together.
    _, weighed = _case_weighed("attention_fwd", ATTENTION_CHEAT, "train_check_b2_h2_s256_d128_f32")
    assert weighed.message is None and 0 < weighed.ratio < 1


@pytest.mark.parametrize("task,name", [("softmax", "softmax_two_kernels"),
                                       ("transformer_mlp_fwd", "mlp_unfused")])
def test_honest_multi_kernel_programs_pass_at_every_case(task, name):
    for case in get_task(task).cases:
        summary, weighed = _case_weighed(task, HONEST / f"{name}.py", case.name)
        assert summary.intermediates, case.name  # the analysis sees their intermediate...
        assert weighed.message is None, weighed.message  # ...and lets it pass


def test_unfused_mlp_float32_hidden_counts_at_the_case_width():
    # bf16 case, [M, F] float32 hidden: 1.8x in bytes, 0.9x counted at 2 bytes an element.
    summary, weighed = _case_weighed("transformer_mlp_fwd", HONEST / "mlp_unfused.py",
                                     "heldout_bench_M3000_D1000_F4000_bf16")
    assert summary.intermediates[0].dtype == "float32"
    assert 0.8 < weighed.ratio < 1.0


def test_intermediate_in_a_loop_counts_every_run():
    def program(x):  # [8, 256, 256]: one slice per iteration through two kernels
        def body(i, acc):
            p = jnp.exp(_kernel_call(x[i]))  # [256, 256] between kernels, 8 times
            return acc + _kernel_call(p).sum()
        return jax.lax.fori_loop(0, 8, body, 0.0)

    summary = _summary(program, jax.ShapeDtypeStruct((8, 256, 256), jnp.float32))
    inter = summary.intermediates[0]
    assert inter.shape == [256, 256] and inter.nbytes == 8 * 256 * 256 * 4
    assert inter.outside_ops == ["exp"]
    weighed = weigh(summary.intermediates, summary.outside_math, [((8, 16, 16), "float32")], "c")
    assert "made 8 times in a loop" in weighed.message


def test_intermediate_through_jit_and_custom_vjp_is_followed():
    @jax.custom_vjp
    def second(x):
        return _kernel_call(x)

    second.defvjp(lambda x: (second(x), None), lambda _, g: (g,))
    program = jax.jit(lambda x: second(jnp.tanh(jax.jit(_kernel_call)(x))))
    summary = _summary(program, jax.ShapeDtypeStruct((64, 128), jnp.float32))
    (inter,) = summary.intermediates
    assert inter.outside_ops == ["tanh"] and inter.producer != inter.consumer


def test_outside_math_over_a_large_tensor_is_refused_without_an_intermediate():
    def program(a, b):  # exp over the [n, n] outer product in XLA, a kernel copies it
        return _kernel_call(jnp.exp(a[:, None] * b[None, :])).sum(axis=1)  # and XLA sums it

    n = 1024
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    summary = _summary(program, spec, spec)
    assert not summary.intermediates
    weighed = weigh(summary.intermediates, summary.outside_math, [((n,), "float32")] * 3, "c")
    assert weighed.message.startswith(
        "at case c exp, reduce_sum run outside any Pallas kernel over a [1024, 1024] float32 tensor")
    assert math.isclose(weighed.ratio, n * n / (3 * n))
