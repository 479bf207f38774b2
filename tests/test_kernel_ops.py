"""The in-kernel stand-in for jnp.cumsum (data_gen/repairs/kernel_ops.py) and the repairer that
puts it in place of a real attempt's `jnp.cumsum` (`unsupported_op`).

The stand-in must compute jnp.cumsum inside a Pallas kernel, forwards and reversed, over rows that
are whole 128-lane chunks and rows that are not, and lower and compile for TPU where jnp.cumsum
does not; what it cannot compute it must refuse.
"""
import numpy as np
import pytest

from data_gen.repairs.kernel_ops import _verified_cumsum
from data_gen.repairs.repairers import repair

jax = pytest.importorskip("jax")
jnp = jax.numpy
pl = pytest.importorskip("jax.experimental.pallas")
pltpu = pytest.importorskip("jax.experimental.pallas.tpu")


def _rows_kernel(scan, shape, block_rows, dtype=jnp.float32):
    """A row-blocked Pallas call whose kernel applies `scan` to its block."""
    def body(x_ref, o_ref):
        o_ref[...] = scan(x_ref[...])

    spec = pl.BlockSpec((block_rows, shape[1]), lambda i: (i, 0))
    return lambda x: pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(shape, dtype), grid=(shape[0] // block_rows,),
                                    in_specs=[spec], out_specs=spec, interpret=pltpu.InterpretParams())(x)


SCANS = {  # rows x lanes, rows per block, dtype
    "whole chunks": ((16, 384), 8, jnp.float32),
    "a long row": ((8, 32768), 8, jnp.float32),
    "no multiple of 128": ((16, 200), 8, jnp.float32),
    "one chunk": ((32, 128), 16, jnp.float32),
    "bfloat16": ((16, 256), 16, jnp.bfloat16),
}


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
@pytest.mark.parametrize("name", SCANS)
def test_the_scan_computes_cumsum_inside_a_kernel(name, reverse):
    shape, rows, dtype = SCANS[name]
    x = jax.random.uniform(jax.random.PRNGKey(len(name)), shape, jnp.float32, -1.0, 1.0).astype(dtype)
    got = _rows_kernel(lambda v: _verified_cumsum(v, axis=1, reverse=reverse), shape, rows, dtype)(x)
    wide = x.astype(jnp.float32)
    want = jnp.flip(jnp.cumsum(jnp.flip(wide, 1), 1), 1) if reverse else jnp.cumsum(wide, 1)
    tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want.astype(dtype), np.float32),
                               rtol=tolerance, atol=tolerance * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
def test_the_scan_along_the_rows_swaps_them_to_the_lanes_and_back(reverse):
    x = jax.random.uniform(jax.random.PRNGKey(3), (256, 128), jnp.float32, -1.0, 1.0)
    got = _rows_kernel(lambda v: _verified_cumsum(v, axis=0, reverse=reverse), (256, 128), 256)(x)
    want = jnp.flip(jnp.cumsum(jnp.flip(x, 0), 0), 0) if reverse else jnp.cumsum(x, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_what_the_scan_cannot_compute_it_refuses():
    block = jnp.ones((8, 256), jnp.float32)
    with pytest.raises(NotImplementedError):
        _verified_cumsum(block, axis=None)  # jnp.cumsum's flattened scan
    with pytest.raises(NotImplementedError):
        _verified_cumsum(jnp.ones((256,)), axis=0)  # a vector: no block to lay the chunks in
    with pytest.raises(NotImplementedError):
        _verified_cumsum(jnp.ones((8, 1000)), axis=-1)  # no multiple of 128 and longer than one chunk


@pytest.mark.tpu_compile
def test_the_scan_compiles_for_tpu_where_cumsum_does_not():
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    device = topologies.get_topology_desc(topology_name="v6e:2x2", platform="tpu").devices[0]

    def compiled(scan):
        def body(x_ref, o_ref):
            o_ref[...] = scan(x_ref[...])

        spec = pl.BlockSpec((8, 4096), lambda i: (i, 0))
        call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((32, 4096), jnp.float32), grid=(4,),
                              in_specs=[spec], out_specs=spec)
        arg = jax.ShapeDtypeStruct((32, 4096), jnp.float32, sharding=SingleDeviceSharding(device))
        with jax.default_device(device):
            return jax.jit(call).trace(arg).lower().compile()

    with pytest.raises(Exception, match="cumsum"):
        compiled(lambda v: jnp.cumsum(v, axis=1))
    assert compiled(lambda v: _verified_cumsum(v, axis=1, reverse=True)) is not None
    assert compiled(lambda v: _verified_cumsum(v, axis=0)) is not None


REVERSED = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x):
    def body(x_ref, o_ref):
        block = x_ref[...]
        o_ref[...] = jnp.flip(jnp.cumsum(jnp.flip(block, axis=1), axis=1), axis=1)

    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[spec], out_specs=spec)(jnp.cumsum(x, axis=0))
'''


def test_the_repairer_puts_the_scan_in_place_of_cumsum_in_kernels_only():
    fixed = repair("unsupported_op", REVERSED, "Unimplemented primitive in Pallas TPU lowering: cumsum")
    assert "o_ref[...] = _verified_cumsum(block, axis=1, reverse=True)" in fixed
    assert "(jnp.cumsum(x, axis=0))" in fixed  # outside the kernel: XLA's, and not this repair's business
    assert fixed.count("def _verified_cumsum(") == 1 and fixed.count("def _verified_triangle(") == 1
    assert repair("unsupported_op", fixed) is None  # nothing left to repair
    forward = repair("unsupported_op", REVERSED.replace("jnp.flip(jnp.cumsum(jnp.flip(block, axis=1), axis=1), axis=1)",
                                                        "jnp.cumsum(block, axis=1)"))
    assert "o_ref[...] = _verified_cumsum(block, axis=1)" in forward
    namespace: dict = {}
    exec(compile(fixed, "repaired.py", "exec"), namespace)  # the appended code defines what it calls
    x = jax.random.uniform(jax.random.PRNGKey(0), (16, 256))
    with pltpu.force_tpu_interpret_mode():
        got = namespace["kernel"](x)
    want = jnp.cumsum(x, axis=0)
    np.testing.assert_allclose(got, jnp.flip(jnp.cumsum(jnp.flip(want, 1), 1), 1), rtol=1e-5, atol=1e-4)
