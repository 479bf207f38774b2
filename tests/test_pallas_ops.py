"""The Pallas stand-ins for XLA convolutions (data_gen/repairs/pallas_ops.py) and the repairer that
puts them in place of a real attempt's `jax.lax.conv_*` calls (`work_outside`).

The stand-ins must compute what XLA computes for every argument real attempts pass: the cases
below cover the layouts, strides, paddings (strings and pairs), dilations of both operands,
feature groups (depthwise too), 1 to 3 spatial dims, and conv_transpose's own padding rules.
"""
import numpy as np
import pytest

from data_gen.repairs import repair_search
from data_gen.repairs.pallas_ops import _verified_conv_general_dilated, _verified_conv_transpose
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


def test_a_convolution_left_to_xla_is_repaired_by_the_search_and_explained(evaluator):
    task = get_task("conv1d")
    failing = evaluator.grade(task, CONV_OUTSIDE, seed=0)
    assert failing.status == "work_outside_kernel", failing.message
    found = repair_search.search(CONV_OUTSIDE, failing, lambda code: evaluator.grade(task, code, seed=0))
    assert found.repaired, found.verdict.message
    assert [e.repairer for e in found.edits] == ["work_outside"]
    assert "y = _verified_conv_general_dilated(x, w," in found.code and "y = jax.lax.conv" not in found.code
    text = repair_search.explain(found.edits)
    assert "`jax.lax.conv_general_dilated` (line 14)" in text
    assert "outside the Pallas kernel" in text and "Pallas matmul" in text
    from data_gen.rows.text_rules import violations
    assert violations(failing.message, text, CONV_OUTSIDE) == []
    # nothing to move: a kernel with no XLA convolution, or one already repaired
    assert repair("work_outside", task.solution_source()) is None
    assert repair("work_outside", found.code) is None
