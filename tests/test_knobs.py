"""Finding a kernel's block-size knobs in its source, and rewriting them."""
import ast

import pytest

from evaluator.candidate.knobs import choices, find_knobs, rewrite
from tasks import get_task

LITERAL_BLOCKS = '''
import jax
from jax.experimental import pallas as pl

EPS = 1e-6
NUM_STAGES = 3  # tune: 2, 3, 4
LANES = 128

def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 256  # 256 here is data, inside the kernel body

def kernel(x):
    n = x.shape[0]
    return pl.pallas_call(
        _body, grid=(n // 256,),  # rows of 256
        in_specs=[pl.BlockSpec((256, 512), lambda i: (i, 0))],
        out_specs=pl.BlockSpec(block_shape=(256, 512), index_map=lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


def test_block_constants_of_a_solution_are_knobs():
    knobs = {k.name: k for k in find_knobs(get_task("matmul").solution_source())}
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(knobs)
    assert all(k.kind == "constant" for k in knobs.values())


def test_marked_constants_and_literal_block_shapes_are_knobs_and_nothing_else():
    knobs = {k.name: k for k in find_knobs(LITERAL_BLOCKS)}
    assert set(knobs) == {"NUM_STAGES", "256 in kernel()", "512 in kernel()"}
    assert knobs["NUM_STAGES"].choices == (2, 3, 4)
    assert choices(knobs["NUM_STAGES"], 4096) == [2, 3, 4]


def test_rewrite_moves_a_literal_block_with_its_grid_and_nothing_else():
    knobs = find_knobs(LITERAL_BLOCKS)
    out = rewrite(LITERAL_BLOCKS, knobs, {"256 in kernel()": 1024, "NUM_STAGES": 4})
    ast.parse(out)
    assert "grid=(n // 1024,),  # rows of 256" in out  # code changed, the comment kept
    assert out.count("(1024, 512)") == 2
    assert "x_ref[...] + 256" in out  # the kernel body is another function
    assert "NUM_STAGES = 4  # tune: 2, 3, 4" in out and "LANES = 128" in out


def test_rewrite_of_constants_keeps_the_rest_of_the_file():
    source = get_task("matmul").solution_source()
    knobs = find_knobs(source)
    out = rewrite(source, knobs, {"BLOCK_M": 128})
    assert "BLOCK_M = 128\n" in out
    assert out.replace("BLOCK_M = 128\n", "") == source.replace(
        next(line for line in source.splitlines(keepends=True) if line.startswith("BLOCK_M =")), "")


@pytest.mark.parametrize("value,expected", [
    (512, [128, 256, 512, 1024, 2048, 4096]),
    (384, [128, 256, 384, 512, 1024, 2048, 4096]),
    (16, [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]),
])
def test_choices_keep_the_alignment_and_stop_at_the_largest_dim(value, expected):
    from evaluator.candidate.knobs import Knob

    assert choices(Knob("BLOCK", value, "constant", (1,)), 4096) == expected
