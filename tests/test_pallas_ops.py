"""The Pallas stand-ins for XLA convolutions and matmuls (data_gen/repairs/pallas_ops.py) and the
repairer that puts them in place of a real attempt's `jax.lax.conv_*`, `jnp.matmul` and `jnp.dot`
calls (`work_outside`).

The stand-ins must compute what XLA computes for every argument real attempts pass: the cases
below cover the layouts, strides, paddings (strings and pairs), dilations of both operands,
feature groups (depthwise too), 1 to 3 spatial dims, and conv_transpose's own padding rules.
"""
import numpy as np
import pytest

from data_gen.repairs import repair_search
from data_gen.repairs.pallas_ops import (_verified_conv_general_dilated, _verified_conv_transpose, _verified_jnp_dot,
                                         _verified_jnp_matmul)
from data_gen.repairs.repairers import repair
from tasks import get_task

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
pltpu = pytest.importorskip("jax.experimental.pallas.tpu")


def _normal(*shape: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(sum(shape)).standard_normal(shape), jnp.float32)


CONV_CASES = {
    "2d SAME NHWC": ((_normal(2, 9, 10, 6), _normal(3, 3, 6, 8), (1, 1), "SAME"),
                     dict(dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "2d NCHW strided, pairs": ((_normal(2, 6, 11, 9), _normal(8, 6, 3, 2), (2, 1), ((1, 2), (0, 1))),
                               dict(dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "2d groups, rhs dilation": ((_normal(1, 8, 12, 12), _normal(8, 4, 3, 3), (1, 1), "VALID"),
                                dict(rhs_dilation=(2, 1), dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                     feature_group_count=2)),
    "2d depthwise": ((_normal(2, 10, 10, 6), _normal(3, 3, 1, 6), (1, 1), "SAME"),
                     dict(dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=6)),
    "1d default layout": ((_normal(2, 5, 20), _normal(7, 5, 4), (2,), "SAME"), {}),
    "3d lhs dilation": ((_normal(1, 4, 5, 6, 3), _normal(3, 4, 3, 3, 2), (1, 1, 1), ((2, 2), (1, 1), (2, 2))),
                        dict(lhs_dilation=(2, 1, 2), dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))),
}
TRANSPOSE_CASES = {
    "2d SAME": dict(lhs=_normal(2, 8, 8, 6), rhs=_normal(3, 3, 7, 6), strides=(2, 2), padding="SAME",
                    dimension_numbers=("NHWC", "HWOI", "NHWC")),
    "2d pairs": dict(lhs=_normal(2, 8, 8, 6), rhs=_normal(4, 4, 7, 6), strides=(2, 2), padding=((2, 3), (2, 3)),
                     dimension_numbers=("NHWC", "HWOI", "NHWC")),
    "3d VALID": dict(lhs=_normal(1, 5, 4, 6, 3), rhs=_normal(3, 3, 3, 4, 3), strides=(2, 2, 2), padding="VALID",
                     dimension_numbers=("NDHWC", "DHWOI", "NDHWC")),
    "2d transpose_kernel, dilated": dict(lhs=_normal(2, 8, 8, 6), rhs=_normal(3, 3, 7, 6), strides=(3, 1),
                                         padding="SAME", transpose_kernel=True, rhs_dilation=(1, 2)),
    "2d consistent padding": dict(lhs=_normal(2, 8, 8, 6), rhs=_normal(3, 3, 6, 7), strides=(2, 2),
                                  padding=((1, 1), (1, 1)), use_consistent_padding=True),
}


@pytest.mark.parametrize("name", CONV_CASES)
def test_the_convolution_stand_in_computes_what_xla_does(name):
    args, kwargs = CONV_CASES[name]
    want = lax.conv_general_dilated(*args, **kwargs, precision=lax.Precision.HIGHEST)
    with pltpu.force_tpu_interpret_mode():
        got = _verified_conv_general_dilated(*args, **kwargs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TRANSPOSE_CASES)
def test_the_transposed_convolution_stand_in_computes_what_xla_does(name):
    kwargs = TRANSPOSE_CASES[name]
    want = lax.conv_transpose(**kwargs, precision=lax.Precision.HIGHEST)
    with pltpu.force_tpu_interpret_mode():
        got = _verified_conv_transpose(**kwargs)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


MATMUL_CASES = {  # (a, b, preferred_element_type); 1030 rows and 1100 contracted: two blocks, padded
    "2d": (_normal(37, 50), _normal(50, 29), None),
    "rows folded, M padded": (_normal(2, 515, 8), _normal(8, 4), None),
    "K over two blocks": (_normal(4, 1100), _normal(1100, 3), None),
    "batched": (_normal(2, 3, 9, 20), _normal(2, 3, 20, 7), None),
    "bf16 into f32": (_normal(16, 64).astype(jnp.bfloat16), _normal(64, 8).astype(jnp.bfloat16), jnp.float32),
}


@pytest.mark.parametrize("name", MATMUL_CASES)
def test_the_matmul_stand_ins_compute_what_xla_does(name):
    a, b, out_type = MATMUL_CASES[name]
    want = jnp.matmul(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=out_type)
    with pltpu.force_tpu_interpret_mode():
        got = _verified_jnp_matmul(a, b, preferred_element_type=out_type)
        dot = _verified_jnp_dot(a, b, preferred_element_type=out_type) if b.ndim == 2 else got
    for out in (got, dot):
        assert out.shape == want.shape and out.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=1e-4, atol=1e-4)


def test_a_dot_that_is_no_matmul_is_refused_not_approximated():
    with pytest.raises(NotImplementedError, match="dot of shapes"):
        _verified_jnp_dot(_normal(2, 3, 4), _normal(2, 4, 5))  # jnp.dot: an outer product over batches
    with pytest.raises(NotImplementedError, match="matmul of shapes"):
        _verified_jnp_matmul(_normal(2, 3, 4), _normal(5, 4, 6))


# The pattern of GPT-5.3's JAXBench convolutions: XLA's convolution outside, a Pallas epilogue.
CONV_OUTSIDE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 256


def _cast(y_ref, o_ref):
    o_ref[...] = y_ref[...].astype(o_ref.dtype)


def kernel(x, w):
    y = jax.lax.conv_general_dilated(x, w, window_strides=(1,), padding="VALID",
                                     dimension_numbers=("NWC", "WIO", "NWC"),
                                     preferred_element_type=jnp.float32)
    b, l, c = y.shape
    out = pl.pallas_call(
        _cast, grid=(pl.cdiv(b * l, ROWS),),
        in_specs=[pl.BlockSpec((ROWS, c), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((ROWS, c), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((b * l, c), x.dtype),
    )(y.reshape(b * l, c))
    return out.reshape(b, l, c)
'''


# GPT-5.3's JAXBench Gemm attempts (30_Gemm_GroupNorm_Hardtanh and others): the product in XLA,
# the rest in a blocked Pallas kernel.
MATMUL_OUTSIDE = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 256


def _cast(y_ref, o_ref):
    o_ref[...] = y_ref[...].astype(o_ref.dtype)


def kernel(x, w):
    y = jnp.matmul(x, w, preferred_element_type=jnp.float32)
    m, n = y.shape
    return pl.pallas_call(
        _cast, grid=(pl.cdiv(m, ROWS),),
        in_specs=[pl.BlockSpec((ROWS, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((ROWS, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(y)
'''


# (task, attempt, its call to XLA, that call after the repair, how the explanation names it, the
# op it must not name)
LEFT_TO_XLA = {
    "convolution": ("conv1d", CONV_OUTSIDE, "y = jax.lax.conv", "y = _verified_conv_general_dilated(x, w,",
                    "The convolution ran in XLA: `jax.lax.conv_general_dilated` (line 14)", "matmul ran"),
    "matmul": ("matmul", MATMUL_OUTSIDE, "y = jnp.matmul", "y = _verified_jnp_matmul(x, w,",
               "The matmul ran in XLA: `jnp.matmul` (line 14)", "convolution"),
}


@pytest.mark.parametrize("op", LEFT_TO_XLA)
def test_work_left_to_xla_is_repaired_by_the_search_and_explained(evaluator, op):
    from data_gen.rows.text_rules import violations

    name, source, xla_call, repaired_call, told, not_told = LEFT_TO_XLA[op]
    task = get_task(name)
    failing = evaluator.grade(task, source, seed=0)
    assert failing.status == "work_outside_kernel", failing.message
    found = repair_search.search(source, failing, lambda code: evaluator.grade(task, code, seed=0))
    assert found.repaired, found.verdict.message
    assert [e.repairer for e in found.edits] == ["work_outside"]
    assert repaired_call in found.code and xla_call not in found.code
    text = repair_search.explain(found.edits)
    assert f"{told} is called outside the Pallas kernel" in text and "Pallas matmul" in text
    assert not_told not in text, text
    assert violations(failing.message, text, source) == []
    # nothing to move: a kernel with no XLA convolution or matmul, or one already repaired
    assert repair("work_outside", task.solution_source()) is None
    assert repair("work_outside", found.code) is None
