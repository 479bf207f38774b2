"""The repairers (data_gen/repairs/repairers.py): each turns a small buggy kernel into the expected
source, leaves correct kernels alone, and a softmax with three bugs repaired grades correct."""
from pathlib import Path

import pytest

from data_gen.repairs.repairers import REPAIRERS, repair

ROOT = Path(__file__).parent.parent
SOLUTIONS = sorted((ROOT / "tasks").glob("*/solution.py"))
SOFTMAX = (ROOT / "tasks" / "softmax" / "solution.py").read_text()


def _sub(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def test_every_catalogue_kind_names_a_registered_repairer():
    from data_gen.catalogue.kinds import KINDS

    named = {k.repairer for k in KINDS if k.repairer}
    assert named <= set(REPAIRERS) and len(named) >= 15
    with pytest.raises(KeyError):
        repair("no_such_kind", SOFTMAX)


def test_a_missing_standard_import_is_added_after_the_others():
    broken = SOFTMAX.replace("import jax.numpy as jnp\n", "")
    fixed = repair("undefined_name", broken, "NameError: name 'jnp' is not defined")
    assert fixed is not None and "import jax.numpy as jnp" in fixed
    assert repair("undefined_name", broken, "NameError: name 'my_helper' is not defined") is None


@pytest.mark.parametrize("kind", sorted(REPAIRERS))
def test_correct_kernels_are_left_alone(kind):
    # vmem_exhaustion can always shrink a block; it acts only on a message about memory.
    message = "Mismatch: wrong values" if kind == "vmem_exhaustion" else ""
    changed = [p.parent.name for p in SOLUTIONS if repair(kind, p.read_text(), message) is not None]
    assert changed == []


def test_unparseable_source_gives_none_except_prose():
    for kind in REPAIRERS:
        if kind != "prose_in_code":
            assert repair(kind, "def f(:\n") is None


def test_block_alignment_rounds_literals_that_feed_blockspecs():
    src = _sub(SOFTMAX, "BLOCK_ROWS = 512", "BLOCK_ROWS = 500")
    assert repair("block_alignment", src) == _sub(SOFTMAX, "BLOCK_ROWS = 512", "BLOCK_ROWS = 512")
    direct = ("def f(x):\n    bm = 100\n    other = 100\n"
              "    return pl.pallas_call(k, in_specs=[pl.BlockSpec((bm, 250), lambda i: (i, 0))])(x)\n")
    assert repair("block_alignment", direct) == direct.replace("bm = 100", "bm = 128").replace("250", "256")


ROW_KERNEL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _rows(x_ref, o_ref):
    x = x_ref[0, :]
    o_ref[0, :] = x / jnp.sum(jnp.abs(x))


def kernel(x):
    n, d = x.shape
    return pl.pallas_call(_rows, grid=(n,), in_specs=[pl.BlockSpec((1, d), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((1, d), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""
REFUSED_ROW = ("ValueError: The Pallas TPU lowering currently requires that the last two dimensions of your block "
               "shape are divisible by 8 and 128 respectively, or be equal to the respective dimensions of the "
               "overall array. Block spec for args[0] in pallas_call _rows at candidate.py:12 has block shape "
               "(Blocked(block_size=1), Blocked(block_size=2048)), array shape (2048, 2048), and index_map")


def test_a_block_of_one_row_becomes_eight_rows_reduced_along_the_row():
    fixed = repair("block_alignment", ROW_KERNEL, REFUSED_ROW)
    assert fixed is not None
    assert "x = x_ref[...]" in fixed and "o_ref[...] = x / jnp.sum(jnp.abs(x), axis=-1, keepdims=True)" in fixed
    assert "grid=(pl.cdiv(n, 8),)" in fixed and fixed.count("pl.BlockSpec((8, d), lambda i: (i, 0))") == 2
    # without Mosaic's refusal naming a one-row block, the row layout is left alone
    assert repair("block_alignment", ROW_KERNEL, "") is None
    # a block name shared with a (1, d) weight that every step reads whole: the weight's block stays
    shared = ROW_KERNEL.replace("    n, d = x.shape\n", "    n, d = x.shape\n    block = (1, d)\n").replace(
        "in_specs=[pl.BlockSpec((1, d), lambda i: (i, 0))]",
        "in_specs=[pl.BlockSpec(block, lambda i: (i, 0)), pl.BlockSpec(block, lambda i: (0, 0))]")
    fixed = repair("block_alignment", shared, REFUSED_ROW)
    assert "block = (1, d)" in fixed
    assert "pl.BlockSpec((8, d), lambda i: (i, 0)), pl.BlockSpec(block, lambda i: (0, 0))" in fixed


def test_vmem_exhaustion_halves_the_largest_block():
    src = _sub(SOFTMAX, "BLOCK_ROWS = 512", "BLOCK_ROWS = 4096")
    out = repair("vmem_exhaustion", src, "RESOURCE_EXHAUSTED: ran out of VMEM")
    assert out == _sub(SOFTMAX, "BLOCK_ROWS = 512", "BLOCK_ROWS = 2048")
    no_grid = ("def kernel(x):\n    return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)\n")
    assert repair("vmem_exhaustion", no_grid, "out of VMEM") is None


def test_blocks_over_the_scoped_limit_that_fit_the_chip_ask_for_a_limit():
    over = ("kernel _rows at case c needs at least {} MiB of VMEM for its pipelined blocks and scratch (in (8, 2048) "
            "float32 x2), over the default scoped VMEM limit of 32 MiB on v6e; a TPU compiler would reject it")
    fixed = repair("vmem_exhaustion", ROW_KERNEL, over.format("48.0"))
    assert fixed == ROW_KERNEL.replace("out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)",
                                       "out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), "
                                       "compiler_params=pltpu.CompilerParams(vmem_limit_bytes=62914560))(x)")
    # more than three quarters of the chip's 128 MiB: no limit is asked for, and no literal is there to halve
    assert repair("vmem_exhaustion", ROW_KERNEL, over.format("120.0")) is None
    # over the kernel's own limit: that limit is raised
    own = ("kernel _rows needs at least 60.0 MiB of VMEM for its pipelined blocks and scratch, over "
           "vmem_limit_bytes=62914560 (physical 128 MiB); a TPU compiler would reject it")
    assert repair("vmem_exhaustion", fixed, own) == fixed.replace("62914560", str(75 * 2 ** 20))


KERNEL_IF = '''\
def k_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(1)
    if k == 0:
        acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += x_ref[...]
    o_ref[...] = acc_ref[...] if k > 0 else x_ref[...]
'''


def test_traced_bool():
    out = repair("traced_bool", KERNEL_IF)
    assert out == KERNEL_IF.replace(
        "    if k == 0:\n", "    @pl.when(k == 0)\n    def _when_3():\n").replace(
        "acc_ref[...] if k > 0 else x_ref[...]", "jnp.where(k > 0, acc_ref[...], x_ref[...])")


def test_traced_index():
    src = ("def k_kernel(x_ref, o_ref, *, bk):\n    i = pl.program_id(0)\n    start = i * 8\n"
           "    a = x_ref[start:start + 8, :]\n    b = x_ref[i * bk:(i + 1) * bk]\n    o_ref[...] = a + b\n")
    assert repair("traced_index", src) == src.replace("start:start + 8", "pl.ds(start, 8)").replace(
        "i * bk:(i + 1) * bk", "pl.ds(i * bk, bk)")


def test_unsupported_op():
    src = _sub(SOFTMAX, "jnp.sum(e, axis=-1, keepdims=True)", "jnp.cumsum(e, axis=-1)[..., -1:]")
    src = _sub(src, "jnp.max(x, axis=-1, keepdims=True)", "jnp.sort(x, axis=-1)[..., -1:]")
    assert repair("unsupported_op", src) == SOFTMAX


def test_api_misuse():
    src = _sub(SOFTMAX, "out_shape=jax", "out_shapes=jax")
    src = _sub(src, "pltpu.CompilerParams(dimension_semantics", "pltpu.TPUCompilerParams(dimension_semantic")
    src = _sub(src, "import tpu as pltpu", "import mosaic_tpu as pltpu")
    src = _sub(src, "in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))]",
               "in_specs=[pl.BlockSpec(lambda i: (i, 0), (br, d))]")
    assert repair("api_misuse", src) == SOFTMAX
    assert repair("api_misuse", "s = pl.BlockSpec(memory_space=pltpu.TPUMemorySpace.ANY)\n") == \
        "s = pl.BlockSpec(memory_space=pl.ANY)\n"
    # APIs real models call that this JAX has not (GPT-5.3 on JAXBench): pl.when as a function, pltpu.repeat
    assert repair("api_misuse", "pl.when(k == 0, init)\n") == "pl.when(k == 0)(init)\n"
    assert repair("api_misuse", "w = pltpu.repeat(w, x.shape[0], axis=0)\n") == \
        "w = jnp.concatenate([w] * x.shape[0], axis=0)\n"
    assert repair("api_misuse", "a = pltpu.repeat(a, (1, n))\n") == "a = jnp.tile(a, (1, n))\n"


def test_captured_constant():
    src = ("def norm_kernel(x_ref, o_ref, *, eps):\n    o_ref[...] = x_ref[...] + eps\n\n\n"
           "def kernel(x):\n    f = functools.partial(norm_kernel, eps=jnp.asarray(1e-6, jnp.float32))\n"
           "    g = functools.partial(norm_kernel, eps=jnp.float32(-2.0))\n"
           "    return pl.pallas_call(f, out_shape=x)(x)\n")
    assert repair("captured_constant", src) == src.replace("jnp.asarray(1e-6, jnp.float32)", "1e-6").replace(
        "jnp.float32(-2.0)", "-2.0")


def test_ref_store_mismatch():
    src = ("def mm_kernel(x_ref, y_ref, o_ref, acc_ref):\n"
           "    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.bfloat16)\n\n\n"
           "scratch = [pltpu.VMEM((bm, bn), jnp.bfloat16)]\n")
    assert repair("ref_store_mismatch", src, "Invalid dtype for `swap`") == src.replace("jnp.bfloat16", "jnp.float32")
    assert repair("ref_store_mismatch", src, "Mismatch at (0, 3)") is None
    assert repair("ref_store_mismatch", src) is None
    scalar = ("def sum_kernel(x_ref, o_ref):\n    o_ref[0, 0] = jnp.sum(x_ref[...].astype(jnp.float32))\n\n\n"
              "def kernel(x):\n    return pl.pallas_call(sum_kernel, grid=(4,),\n"
              "        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],\n"
              "        out_specs=pl.BlockSpec((8, 1), lambda i: (i, 0)), out_shape=x)(x)\n")
    assert repair("ref_store_mismatch", scalar) == scalar.replace(
        "o_ref[0, 0] = jnp.sum(x_ref[...].astype(jnp.float32))",
        "o_ref[...] = jnp.sum(x_ref[...].astype(jnp.float32), axis=-1, keepdims=True)")


def test_shape_error():
    src = _sub(SOFTMAX, "jnp.max(x, axis=-1, keepdims=True)", "jnp.max(x, axis=-1)")
    src = _sub(src, "s = jnp.sum(e, axis=-1, keepdims=True)", "s = jnp.sum(e, axis=-1)")
    assert repair("shape_error", src, "Incompatible shapes for broadcasting") == SOFTMAX
    dot = "def mm_kernel(x_ref, y_ref, o_ref):\n    o_ref[...] = jnp.dot(x_ref[...], y_ref[...].T)\n"
    assert repair("shape_error", dot) is None
    assert repair("shape_error", dot, "dot_general requires contracting dimensions to have the same shape") == \
        dot.replace(".T)", ")")


def test_triton_primitive():
    src = ("def k_kernel(x_ref, y_ref, o_ref):\n    b = pl.broadcast_to(x_ref[...], (8, 128))\n"
           "    o_ref[...] = pl.dot(b, y_ref[...])\n")
    assert repair("triton_primitive", src) == src.replace("pl.broadcast_to", "jnp.broadcast_to").replace(
        "pl.dot(b, y_ref[...])", "jnp.dot(b, y_ref[...], preferred_element_type=jnp.float32)")


def test_block_rank():
    src = _sub(SOFTMAX, "in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))]",
               "in_specs=[pl.BlockSpec((d,), lambda i: (0,))]")
    message = ("ValueError: Block shape for args[0] (= (Blocked(block_size=128),)) must have the same number "
               "of dimensions as the array shape (16, 128).")
    assert repair("block_rank", src) is None
    assert repair("block_rank", src, message) == _sub(
        SOFTMAX, "in_specs=[pl.BlockSpec((br, d), lambda i: (i, 0))]",
        "in_specs=[pl.BlockSpec((None, d), lambda i: (i, 0))]")


def test_block_rank_where_the_index_map_already_walks_every_dim():
    """GPT-5.3's 3_Batched_matrix_multiplication: 2-D blocks of 3-D arrays, 3-D index maps, 2-D
    reads in the kernel. Every block one dim short gets the squeezed leading dim, named or not."""
    src = ("def bmm(a, b):\n"
           "    return pl.pallas_call(kernel, grid=(batch, m // bm, n // bn),\n"
           "        in_specs=[pl.BlockSpec((bm, k), lambda b, i, j: (b, i, 0)),\n"
           "                  pl.BlockSpec((k, bn), lambda b, i, j: (b, 0, j))],\n"
           "        out_specs=pl.BlockSpec((bm, bn), lambda b, i, j: (b, i, j)),\n"
           "        out_shape=out)(a, b)\n")
    message = ("ValueError: Block shape for args[0] (= (Blocked(block_size=128), Blocked(block_size=256))) must "
               "have the same number of dimensions as the array shape (128, 256, 256)")
    fixed = repair("block_rank", src, message)
    assert fixed == src.replace("((bm, k)", "((None, bm, k)").replace("((k, bn)", "((None, k, bn)").replace(
        "((bm, bn)", "((None, bm, bn)")
    assert repair("block_rank", fixed, message) is None  # nothing short any more
    # the specs given to the call's grid_spec, as that attempt wrote them
    in_grid_spec = src.replace("grid=(batch, m // bm, n // bn),", "grid_spec=pltpu.PrefetchScalarGridSpec(grid=(batch, "
                               "m // bm, n // bn),").replace("(b, i, j)),", "(b, i, j))),")
    assert repair("block_rank", in_grid_spec, message) == fixed.replace(
        "grid=(batch, m // bm, n // bn),", "grid_spec=pltpu.PrefetchScalarGridSpec(grid=(batch, m // bm, n // bn),"
    ).replace("(b, i, j)),", "(b, i, j))),")


def test_interpret_flag():
    src = _sub(SOFTMAX, "    )(x)\n", "        interpret=True,\n    )(x)\n")
    assert repair("interpret_flag", src) == SOFTMAX
    inline = "y = pl.pallas_call(k, out_shape=s, interpret=True)(x)\n"
    assert repair("interpret_flag", inline) == "y = pl.pallas_call(k, out_shape=s)(x)\n"


def test_wrong_values():
    src = _sub(SOFTMAX, "grid=(pl.cdiv(rows, br),)", "grid=(rows // br,)")
    src = _sub(src, "out_specs=pl.BlockSpec((br, d), lambda i: (i, 0))",
               "out_specs=pl.BlockSpec((br, d), lambda i: (i + 1, 0))")
    assert repair("wrong_values", src) == SOFTMAX


def test_a_floor_grid_named_before_the_call_is_rounded_up():
    """GPT-5.3's JAXBench 56_conv_standard_2D: `grid_m = rows // block_m` named, then
    `grid=(grid_m, grid_n)`; the last partial block of rows was never written."""
    src = """
def kernel(x):
    block_m = 512
    grid_m = x.shape[0] // block_m
    grid_n = x.shape[1] // 128
    return pl.pallas_call(copy_kernel, out_shape=x, grid=(grid_m, grid_n), in_specs=[spec], out_specs=spec)(x)
"""
    fixed = repair("wrong_values", src)
    assert fixed is not None
    assert "grid_m = pl.cdiv(x.shape[0], block_m)" in fixed and "grid_n = pl.cdiv(x.shape[1], 128)" in fixed
    twice = src.replace("    grid_n = x.shape[1] // 128\n", "    grid_n = x.shape[1] // 128\n    grid_n = 1\n")
    assert "pl.cdiv(x.shape[1], 128)" not in repair("wrong_values", twice)  # which value reaches the grid is unclear


def test_prose_in_code():
    src = _sub(SOFTMAX, "BLOCK_ROWS = 512\n", "Here is the kernel:\n```python\nBLOCK_ROWS = 512\n")
    src = _sub(src, "def kernel(x):\n", "**Note:** the rows are tiled.\ndef kernel(x):\n")
    src += "```\nThis kernel computes a numerically stable softmax.\n"
    assert repair("prose_in_code", src) == SOFTMAX
    assert repair("prose_in_code", SOFTMAX) is None


def test_wrong_entry_point():
    src = SOFTMAX.replace("def kernel(x):", "def softmax(x):")
    assert repair("wrong_entry_point", src) == SOFTMAX
    src2 = src.replace("def _block_rows(", "def block_rows(").replace("_block_rows(rows", "block_rows(rows")
    assert repair("wrong_entry_point", src2) is None  # two candidates: unsure


def test_repaired_softmax_grades_correct(evaluator):
    from tasks import get_task

    broken = _sub(SOFTMAX, "    )(x)\n", "        interpret=True,\n    )(x)\n")
    broken = _sub(broken, "pltpu.CompilerParams(", "pltpu.TPUCompilerParams(")
    broken = _sub(broken, "jnp.sum(e, axis=-1, keepdims=True)", "jnp.cumsum(e, axis=-1)[..., -1:]")
    source = broken
    for kind in ("interpret_flag", "api_misuse", "unsupported_op"):
        fixed = repair(kind, source)
        assert fixed is not None, kind
        source = fixed
    assert source == SOFTMAX
    verdict = evaluator.grade(get_task("softmax"), f"```python\n{source}\n```", "train", seed=0)
    assert verdict.status == "correct", verdict.message[:300]
