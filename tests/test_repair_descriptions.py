"""A search repair told as a reviewer would: each describer names what was wrong, why on TPU and
what the edit does, only when the edit is the one it knows (anything else falls back to the
changed lines), and its prose keeps the dataset's text rules."""
import pytest

from data_gen.repairs import repair_search
from data_gen.repairs.descriptions import DESCRIPTIONS
from data_gen.repairs.repairers import repair
from data_gen.rows.text_rules import violations

ROWS = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def kernel(x, s):
    rows, cols = x.shape
    block_m = 256

    def body(x_ref, s_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    grid_m = rows // block_m
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(grid_m,),
        in_specs=[pl.BlockSpec((block_m, cols), lambda i: (i, 0)), pl.BlockSpec((block_m, 1), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_m, cols), lambda i: (i, 0)),
    )(x, s)
'''
ONE_ROW = ROWS.replace("(block_m, cols)", "(1, cols)").replace("(block_m, 1)", "(1, 1)").replace(
    "grid_m = rows // block_m", "grid_m = rows").replace(
    "o_ref[...] = x_ref[...] * 2.0", "o_ref[...] = x_ref[...] - jnp.max(x_ref[...], axis=1, keepdims=True)")
REPEAT = ROWS.replace("o_ref[...] = x_ref[...] * 2.0", "o_ref[...] = x_ref[...] * pltpu.repeat(s_ref[...], (1, 4))")
SLICES = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(a, b):
    m, k = a.shape
    block_k = 128

    def body(a_ref, b_ref, o_ref):
        def step(k_idx, acc):
            x = a_ref[:, k_idx * block_k:(k_idx + 1) * block_k]
            y = b_ref[k_idx * block_k:(k_idx + 1) * block_k, :]
            return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)
        o_ref[...] = jax.lax.fori_loop(0, k // block_k, step, jnp.zeros(o_ref.shape, jnp.float32))

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((m, b.shape[1]), jnp.float32))(a, b)
'''
WHEN = ROWS.replace("        o_ref[...] = x_ref[...] * 2.0\n", """        i = pl.program_id(0)

        def init():
            o_ref[...] = x_ref[...]

        def add():
            o_ref[...] += x_ref[...]
        pl.when(i == 0, init)
        pl.when(i != 0, add)
""")
SCAN = ROWS.replace("o_ref[...] = x_ref[...] * 2.0",
                    "o_ref[...] = jnp.flip(jnp.cumsum(jnp.flip(x_ref[...], axis=1), axis=1), axis=1)")
BMM = SLICES.replace(
    "    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((m, b.shape[1]), jnp.float32))(a, b)\n",
    "    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((m, b.shape[1]), jnp.float32),\n"
    "        grid=(2, 2, 2),\n"
    "        in_specs=[pl.BlockSpec((bm, k), lambda b, i, j: (b, i, 0)),\n"
    "                  pl.BlockSpec((k, bn), lambda b, i, j: (b, 0, j))],\n"
    "        out_specs=pl.BlockSpec((bm, bn), lambda b, i, j: (b, i, j)))(a, b)\n")
# Messages as the grader words them (evaluator/stages.py) and as Mosaic and jax do.
WRONG = ("wrong values on case train_check_rows1000 (rows=1000, float32): output mismatch; max abs error 3, worst "
         "at index [999, 0] (expected 2, got 0).")
ROW_REFUSED = ("lowering for TPU failed at case c: ValueError: The Pallas TPU lowering currently requires that the "
               "last two dimensions of your block shape are divisible by 8 and 128 respectively, or be equal to the "
               "respective dimensions of the overall array. Block spec for args[0] in pallas_call body at "
               "candidate.py:17 has block shape (Blocked(block_size=1), Blocked(block_size=2048)), array shape "
               "(2048, 2048), and index_map")
MISALIGNED = ROW_REFUSED.replace("block_size=1), Blocked(block_size=2048)), array shape (2048, 2048)",
                                 "block_size=256), Blocked(block_size=2000)), array shape (4096, 4096)")
OVER_VMEM = ("kernel body at case c needs at least 48.0 MiB of VMEM for its pipelined blocks and scratch (in (4096, "
             "2048) float32 x2, out (4096, 2048) float32 x2), over the default scoped VMEM limit of 32 MiB on v6e; a "
             "TPU compiler would reject it (use smaller blocks).")
TRACED = ("tracing kernel() failed at case c: TracerBoolConversionError: Attempted boolean conversion of traced "
          "array with shape bool[].\nThe error occurred while tracing the function body at candidate.py:11 for "
          "fori_loop. This concrete value was not available in Python because it depends on the value of the "
          "argument k_idx.")
WHEN_TYPE_ERROR = ("tracing kernel() failed at case c: TypeError: when() takes 1 positional argument but 2 were "
                   "given\n(at candidate.py line 15: pl.when(i == 0, init))")
NO_CUMSUM = ("lowering for TPU failed at case c: NotImplementedError: Unimplemented primitive in Pallas TPU lowering "
             "for tc: cumsum. Please file an issue at https://github.com/jax-ml/jax/issues/new/choose.")
NO_REV = NO_CUMSUM.replace("for tc: cumsum", "for tc: rev")
RANK = ("tracing kernel() failed at case c: ValueError: Block shape for args[0] (= (Blocked(block_size=128), "
        "Blocked(block_size=256))) must have the same number of dimensions as the array shape (128, 256, 256)")
NO_REPEAT = ("tracing kernel() failed at case c: AttributeError: module 'jax.experimental.pallas.tpu' has no "
             "attribute 'repeat'")
WITH_PARAMS = ROWS.replace("grid=(grid_m,),", "grid=(grid_m,),\n        compiler_params=pltpu.CompilerParams("
                                              "dimension_semantics=('parallel',)),")

# repairer, failing source, message, what the prose must say
CASES = {
    "floor grid": ("wrong_values", ROWS, WRONG,
                   ["`rows // block_m` (line 14) rounds down", "partial block never runs", "`pl.cdiv(rows, block_m)`"]),
    "row blocks": ("block_alignment", ONE_ROW, ROW_REFUSED,
                   ["Blocks of one row, (1, 2048), of a (2048, 2048) array", "multiples of 8 and 128",
                    "blocks of 8 rows, (8, 2048)", "grid walks the 2048 rows", "reduced apart"]),
    "block sizes": ("block_alignment", ROWS.replace("(block_m, cols)", "(block_m, 2000)"), MISALIGNED,
                    ["A block size off TPU's tiling", "the block (256, 2000) of a (4096, 4096) array breaks that",
                     "Fix: round 2000 (line 19) up to 2048, a multiple of 128; 2000 (line 20) up to 2048"]),
    "vmem limit added": ("vmem_exhaustion", ROWS, OVER_VMEM,
                         ["at least 48 MiB of VMEM", "each block held twice", "on v6e",
                          "`vmem_limit_bytes=62914560` (60 MiB"]),
    "vmem limit in params": ("vmem_exhaustion", WITH_PARAMS, OVER_VMEM, ["`vmem_limit_bytes=62914560` (60 MiB"]),
    "traced slices": ("traced_bool", SLICES, TRACED,
                      ["The ref slices `k_idx * block_k:(k_idx + 1) * block_k` (lines 12, 13)",
                       "depend on `k_idx`, a traced value", "Fix: `pl.ds(k_idx * block_k, block_k)`, a window"]),
    "traced slices, spaced": ("traced_bool", SLICES.replace("k_idx * block_k:(k_idx + 1) * block_k",
                                                            "k_idx*block_k : (k_idx+1)*block_k"), TRACED,
                              ["The ref slices `k_idx*block_k : (k_idx+1)*block_k` (lines 12, 13)",
                               "Fix: `pl.ds(k_idx*block_k, block_k)`"]),
    "pltpu.repeat": ("api_misuse", REPEAT, NO_REPEAT,
                     ["`pltpu.repeat` (line 12) does not exist", "Fix: `jnp.tile(s_ref[...], (1, 4))`"]),
    "pl.when with its function": ("api_misuse", WHEN, WHEN_TYPE_ERROR,
                                  ["`pl.when(i == 0, init)`, `pl.when(i != 0, add)` (lines 19, 20) pass the function",
                                   "Fix: `pl.when(i == 0)(init)`, `pl.when(i != 0)(add)`, the condition first"]),
    "floor grid of a product": ("wrong_values", ROWS.replace("rows // block_m", "(rows * 1) // block_m"), WRONG,
                                ["`(rows * 1) // block_m` (line 14) rounds down", "Fix: `pl.cdiv(rows * 1, block_m)`"]),
    "block rank": ("block_rank", BMM, RANK,
                   ["`(bm, k)`, `(k, bn)`, `(bm, bn)` (lines 19, 20, 21) while their index maps return one index",
                    "(args[0] is an array of shape (128, 256, 256))",
                    "Fix: `(None, bm, k)`, `(None, k, bn)`, `(None, bm, bn)`, the leading dim squeezed"]),
    "cumsum in a kernel": ("unsupported_op", SCAN.replace("jnp.flip(jnp.cumsum(jnp.flip(x_ref[...], axis=1), axis=1), "
                                                          "axis=1)", "jnp.cumsum(x_ref[...], axis=1)"), NO_CUMSUM,
                           ["`jnp.cumsum` (line 12) in the kernel has no Mosaic lowering",
                            "(_verified_cumsum, same arguments, its code", "one matmul by a triangular matrix of ones"]),
    "reversed cumsum": ("unsupported_op", SCAN, NO_REV,
                        ["`jnp.cumsum` (line 12) in the kernel, reversed by `jnp.flip` on both sides, cannot lower",
                         "(_verified_cumsum, same arguments (reverse=True for the sums from the end"]),
}


@pytest.mark.parametrize("case", CASES)
def test_each_known_edit_is_told_in_prose_that_keeps_the_text_rules(case):
    repairer, before, message, said = CASES[case]
    after = repair(repairer, before, message)
    assert after is not None
    text = DESCRIPTIONS[repairer](before, after, message)
    for phrase in said:
        assert phrase in text, (phrase, text)
    assert "in place of" not in text
    assert violations(message, text, before) == []
    edit = repair_search.Edit(repairer, repairer, "lowering_error", before, after, message)
    assert repair_search.explain([edit]) == f"One fix makes the kernel correct:\n1. {text}"


@pytest.mark.parametrize("case", ["floor grid", "traced slices", "pltpu.repeat", "vmem limit added"])
def test_an_edit_with_more_in_it_than_the_describer_knows_falls_back_to_its_lines(case):
    repairer, before, message, _ = CASES[case]
    after = repair(repairer, before, message)
    after = after.replace("block_m = 256", "block_m = 512").replace("block_k = 128", "block_k = 256")
    assert after != repair(repairer, before, message)
    assert DESCRIPTIONS[repairer](before, after, message) == ""
    text = repair_search.explain([repair_search.Edit(repairer, repairer, "lowering_error", before, after, message)])
    assert "in place of" in text


def test_a_description_needs_the_message_that_names_its_cause():
    """The VMEM figures, the refused block, the missing `pltpu.repeat` and the op Mosaic cannot lower
    come from the verdict: without them, no prose."""
    for repairer, before, message in (("vmem_exhaustion", ROWS, OVER_VMEM), ("api_misuse", REPEAT, NO_REPEAT),
                                      ("block_alignment", ONE_ROW, ROW_REFUSED),
                                      ("unsupported_op", SCAN, NO_REV.replace("rev", "sort"))):
        after = repair(repairer, before, message)
        assert DESCRIPTIONS[repairer](before, after, "something else failed") == ""


def test_an_index_map_edit_is_not_told_as_a_grid_edit():
    shifted = ROWS.replace("lambda i: (i, 0))]", "lambda i: (i + 1, 0))]").replace(
        "grid_m = rows // block_m", "grid_m = pl.cdiv(rows, block_m)")
    after = repair("wrong_values", shifted, WRONG)
    assert "(i + 1, 0)" not in after
    assert DESCRIPTIONS["wrong_values"](shifted, after, WRONG) == ""
