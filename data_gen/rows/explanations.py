"""What a repair says before its code: the bug in the kernel in front of the model, and the fix.

Written like a reviewer reading the failing kernel: in the present tense, about the code as it
is (never how it was made), consistent with what the evaluator observed. Each operator has
diagnoses per observed status; a status an operator has no diagnosis for gets no explanation,
and the collector drops that pair rather than explain a failure it did not see. Several
phrasings per diagnosis and fix, picked by the mutant's id, keep rows from sharing one template.
data_gen/rows/text_rules.py checks every explanation against the rules the dataset card reports.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from data_gen.failures.edits import Mutant
from evaluator.performance.hardware import MiB
from evaluator.record import Verdict


@dataclass(frozen=True)
class Story:
    """What to say about one bug operator: diagnoses by observed status, then a fix."""

    diagnoses: dict[str, tuple[str, ...]]  # by status, or by "status/where" for a site's variant
    fixes: tuple[str, ...]
    # What the evaluator's message must show for a diagnosis to be true (a regex per status):
    # a mutant that fails some other way is not explained by it.
    evidence: dict[str, str] = field(default_factory=dict)


_OOB = ("runtime_error",)
_STORIES: dict[str, Story] = {
    "misaligned_block": Story(
        {s: ("`{source_line}` sets a block dimension of {value}, which is a multiple of neither 8 nor 128. A "
             "block's last two dims must be multiples of (8, 128) unless they span the whole array, so Mosaic "
             "cannot tile it and lowering fails.",
             "Mosaic tiles VMEM in (8, 128) chunks, and {value} (from `{source_line}`) fits neither: it is not a "
             "multiple of 8 rows or of 128 lanes, so a block that uses it is rejected before the kernel runs.",
             "{value} looks like a reasonable round block size, but TPU blocks are measured in (8, 128) tiles: "
             "the second-to-last dim of a block must be a multiple of 8 and the last a multiple of 128.")
         for s in ("lowering_error", "compile_error")},
        ("Use a multiple of 128 such as {good} for `{name}`; a different grid step count is the only cost.",
         "Set `{name}` to {good}, a whole number of (8, 128) tiles, and let `pl.cdiv` cover any ragged edge.",
         "Pick {good} instead: it keeps every block aligned to the vreg layout."),
        {"lowering_error": r"divisible by 8 and 128|block shape", "compile_error": r"block|tile|align"}),
    "vmem_overallocation": Story(
        {"compile_error": (
            "With `{source_line}`, the blocks at the largest bench shape need about {need_mib} MiB of VMEM "
            "(each pipelined block is double-buffered), more than the {limit_mib} MiB the kernel may use.",
            "`{name}` = {value} is too large for VMEM: at the bench sizes the double-buffered input and output "
            "blocks add up to roughly {need_mib} MiB against a limit of {limit_mib} MiB, so a TPU compiler "
            "refuses the kernel even though the small check shapes would run.",
            "The kernel is correct at small shapes, but `{name}` = {value} makes each bench-size block so big "
            "that the pipeline's two buffers per operand need {need_mib} MiB, over the {limit_mib} MiB VMEM "
            "budget.")},
        ("Halve it back to {good}: the grid takes more steps and every block pair fits with room to spare.",
         "Use `{name}` = {good}; smaller blocks only add grid steps, which the pipeline overlaps with DMA.",
         "Keep blocks near {good} so two buffers per operand (plus scratch) stay well inside VMEM."),
        {"compile_error": r"needs at least [\d.]+ MiB of VMEM"}),
    "whole_array_block": Story(
        {"compile_error": (
            "The `pl.pallas_call` in `{function}` has no grid and no BlockSpecs, so every operand is copied "
            "into VMEM whole. At the bench shape that is about {need_mib} MiB, far beyond the {limit_mib} MiB "
            "of VMEM the kernel may use.",
            "Without `grid=` and `in_specs`/`out_specs`, Pallas treats each whole array as one block. That "
            "works for the small check shapes but needs roughly {need_mib} MiB of VMEM at the large ones "
            "(limit {limit_mib} MiB).",
            "Nothing in `{function}` tiles the arrays: a `pallas_call` without a grid runs once on entire "
            "operands held in VMEM, and at the bench sizes they need {need_mib} MiB against {limit_mib} MiB.")},
        ("Give the call a grid over row blocks and matching `pl.BlockSpec`s, so each step holds one tile.",
         "Tile the work: a `grid=` over blocks, `in_specs`/`out_specs` with `pl.BlockSpec(block, index_map)`, "
         "and the pipeline streams tiles through VMEM.",
         "Split the arrays into blocks with a grid and BlockSpecs, and mark the independent axis parallel."),
        {"compile_error": r"needs at least [\d.]+ MiB of VMEM"}),
    "index_map_shift": Story(
        {"runtime_error": (
            "The index map `{after}` returns `{var} + 1` where the block index is `{var}`, so grid step "
            "`{var}` fetches the next block over and the last step asks for a block past the end of the array "
            "(the out-of-bounds access at `{case}`).",
            "Index maps return block indices, not element offsets; `{after}` adds one to `{var}`, which shifts "
            "every block by one and runs off the end on the final grid step.",
            "`{after}` points each step at block `{var} + 1`. The first block is never read and the last "
            "step reads beyond the array's end."),
         "wrong_output": (
            "The index map `{after}` uses `{var} + 1`: each step works on the neighbouring block, so results "
            "land in the wrong place (out-of-range reads are clamped, not reported).",
            "`{after}` shifts the block index by one along `{var}`, so every tile is computed from the data of "
            "the next tile.")},
        ("Return `{var}` itself, so step `{var}` maps to block `{var}`.",
         "Drop the `+ 1`: block index `{var}` already covers the right rows.",
         "Make the index map return `{var}` at position {position}; Pallas multiplies by the block size."),
        {"runtime_error": r"[Oo]ut-of-bounds|out of bounds|index"}),
    "index_map_swap": Story(
        {s: ("The index map at line {line} returns `{second}` where `{first}` belongs and the reverse, so "
             "each grid step fetches or writes a block from the transposed position.",
             "In the BlockSpec at line {line}, `{first}` and `{second}` appear in the wrong order: the grid "
             "axis that walks one array dimension indexes the other.",
             "Line {line} pairs the grid indices with the wrong array axes (`{second}` before `{first}`), so "
             "blocks come from the wrong place" + (" and run out of range." if s in _OOB else "."))
         for s in ("runtime_error", "wrong_output")},
        ("Order the index map's results like the array's axes: `{first}` for the axis it tiles, then `{second}`.",
         "Swap them back so each grid index selects the block along the axis it iterates.")),
    "floor_grid": Story(
        {"wrong_output": (
            "`{after}` (line {line}) is a floor division, so when `{dim}` is not a multiple of `{block}` the "
            "ragged last block gets no grid step and its outputs are never written (as at `{case}`).",
            "The grid size `{after}` rounds down. For the ragged shapes the tail of the array is never "
            "visited, and those outputs hold garbage.",
            "Rounding the grid down with `{after}` drops the partial last block: only whole blocks are "
            "computed.")},
        ("Use `pl.cdiv({dim}, {block})` so the grid covers the tail; Pallas masks the out-of-range part of "
         "the last block on write-back.",
         "Round the grid up with `pl.cdiv`; the overhanging rows of the last block are dropped when written.")),
    "drop_mask": Story(
        {"wrong_output": (
            "`{kept}` is used unmasked in `{function}` (line {line}). Elements where `{cond}` is false feed "
            "into the result.",
            "Nothing in `{function}` excludes the elements where `{cond}` fails: those entries of `{kept}` "
            "are used along with the real ones.",
            "Line {line} reads `{kept}` without the mask for `{cond}`, so stale or padded values change the "
            "result on the ragged and masked cases.")},
        ("Select with `jnp.where({cond}, {kept}, {fill})` so those elements cannot contribute.",
         "Mask them: `jnp.where({cond}, {kept}, {fill})`.")),
    "python_if_on_traced": Story(
        {"lowering_error": (
            "`{source_line}` uses a Python conditional expression on `{cond}`, an array computed inside the "
            "kernel. Python needs one concrete bool while the kernel is traced, so tracing fails.",
            "Inside a kernel, `{cond}` is a traced array; `... if {cond} else ...` asks Python for its truth "
            "value, which an array being traced does not have.",
            "The conditional at line {line} branches in Python on `{cond}`, whose value only exists when the "
            "kernel runs, element by element.")},
        ("Select element-wise with `jnp.where({cond}, ...)`; for whole blocks of code use `pl.when` or "
         "`lax.cond`.",
         "Use `jnp.where({cond}, a, b)` so the choice happens inside the traced program."),
        {"lowering_error": r"TracerBool|boolean conversion|truth value|ambiguous|concrete"}),
    "program_id_branch": Story(
        {"lowering_error": (
            "`if {cond}:` at line {line} is a Python `if` on a grid index: `pl.program_id` is traced, so "
            "Python cannot decide the branch while the kernel is traced.",
            "The kernel branches with `if {cond}:`, but inside `{function}` grid indices are traced values, "
            "and converting one to a bool raises a TracerBoolConversionError.",
            "`{function}` guards a block with a Python `if {cond}:`. Python `if` runs at trace time, when the "
            "grid position is not yet known.")},
        ("Write the guarded block as a function decorated with `@pl.when({cond})`; it runs only on the grid "
         "steps where the condition holds.",
         "Replace the `if` with `@pl.when({cond})` on a nested function, the traced form of a branch."),
        {"lowering_error": r"TracerBool|boolean conversion|concrete"}),
    "drop_accumulator_init": Story(
        {"wrong_output": (
            "At the first step of the reduction axis (`{cond}`), `{function}` never sets {refs}. Scratch "
            "memory keeps whatever the previous output block left in it, so every block after the first starts "
            "from stale values.",
            "Nothing in `{function}` gives {refs} its starting value: the code that runs when `{cond}` holds is "
            "missing, and VMEM scratch is not reset between output blocks.",
            "{refs} is read on every reduction step, but no step sets it first, so each output block inherits "
            "the previous block's values.")},
        ("Set it at the first step: a `@pl.when({cond})` block at the top of `{function}` that runs `{body}`{more}.",
         "Under `@pl.when({cond})`, before the first update, run `{body}`{more}.")),
    "drop_finalize": Story(
        {"wrong_output": (
            "`{function}` computes its result in scratch but never writes {refs}: the output block keeps "
            "whatever was in the buffer.",
            "The reduction finishes in scratch and stops there: no step of `{function}` stores into {refs}, "
            "so the output is garbage.",
            "{refs} is never assigned in `{function}`, so the accumulated values never reach the output.")},
        ("At the last reduction step, under `@pl.when({cond})`, write the result: `{body}`{more}.",
         "Add a `@pl.when({cond})` block that runs `{body}`{more}.")),
    "bf16_accumulation": Story(
        {"lowering_error/scratch": (
            "`{decl}` makes that buffer bfloat16, but the kernel stores float32 values into it. Pallas refs do "
            "not cast on store, so tracing rejects the dtype mismatch.",
            "The kernel writes float32 results into a bfloat16 buffer (`{decl}`); a ref store needs the value "
            "in the ref's own dtype.",
            "`{source_line}` declares bfloat16 where the code computes in float32, and the store into it fails "
            "on the dtype check."),
         "lowering_error/dot": (
            "`{decl}` asks the MXU for a bfloat16 matmul result. TPU matmuls accumulate in 32 bits, and Mosaic "
            "rejects a narrower accumulator when it lowers the dot.",
            "The dot at line {line} requests `{decl}`; on TPU the matmul accumulator must be 32-bit, so "
            "lowering fails.",
            "Mosaic only lowers matmuls with a 32-bit accumulator, and `{decl}` asks for bfloat16.")},
        ("Accumulate in float32 (`jnp.float32`) and cast to the output dtype once, at the end.",
         "Declare it float32; the MXU produces float32 results for free, and the final store casts."),
        {"lowering_error/scratch": r"[Ii]nvalid dtype|dtype", "lowering_error/dot": r"32-bit|acc"}),
    "no_running_max": Story(
        {"wrong_output": (
            "`{after}` exponentiates `{x}` without subtracting `{shift}`, while the rest of `{function}` "
            "treats its terms as relative to `{shift}`: the terms and their normalisation disagree, so the "
            "result is wrong.",
            "The exponent at line {line} is `{after}`, unshifted. The softmax terms must be relative to "
            "`{shift}` to match the sums and the rescaling they are combined with.",
            "`{function}` takes `{after}` directly, so these terms carry a factor `exp({shift})` that the "
            "normalisation does not.")},
        ("Use `jnp.exp({x} - {shift})`, so every exponent is at most 0.",
         "Subtract `{shift}` inside the exponent.")),
    "off_by_one_comparison": Story(
        {"wrong_output": (
            "`{after}` at line {line} uses `{new_op}` where `{op}` is needed, so the element exactly at the "
            "boundary lands on the wrong side of it.",
            "The comparison `{after}` is off by one: with `{new_op}` the element exactly at the boundary is "
            "treated the opposite way from the reference.",
            "Line {line} compares with `{new_op}`. That moves exactly one row or column across the boundary, "
            "so the cases that reach it differ from the reference.")},
        ("Compare with `{op}`, which includes exactly the positions the reference includes.",
         "Use `{before}`.")),
    "dma_never_waited": Story(
        {s: ("In `{function}` the copy `{copy}` is started but never waited on, so the kernel reads the "
             "destination while the DMA may still be writing it, and the semaphore is left signalled.",
             "`{copy}` has a `.start()` and no `.wait()`: nothing orders the data's arrival before it is used.",
             "Every started DMA needs exactly one wait; `{copy}` in `{function}` gets none.")
         for s in ("wrong_output", "runtime_error", "missing_feature")},
        ("Call `{copy}.wait()` before the destination buffer is read.",
         "Wait on `{copy}` before using its destination, once per start.")),
    "double_buffer_race": Story(
        {"wrong_output": (
            "The prefetch at line {line} targets slot `{slot}`, the buffer the current step is reading, so "
            "the incoming DMA overwrites data while it is in use.",
            "Double buffering needs the next copy to go into the other slot; with `{slot}` the kernel "
            "prefetches on top of the block it is computing on."),
         # a runtime error is the race detector or a deadlock: the mutated index may be the
         # buffer's (a race) or the semaphore's (the next wait is never signalled)
         "runtime_error": (
            "Line {line} sends the prefetch to slot `{slot}`, the one the current step is using, where it "
            "needs the idle one: the copy and its semaphore do not pair with the next step's wait, so "
            "the kernel reads a buffer a DMA is writing, or waits on a semaphore nothing signals.",
            "Double buffering needs the next copy to go into the other slot; with `{slot}` the prefetch "
            "collides with the current step's buffer or semaphore, so the kernel races or deadlocks.")},
        ("Send the prefetch to `1 - {slot}`, the idle buffer.",
         "Use the other slot (`1 - {slot}`) for the next chunk.")),
    "no_parallel_axis": Story(
        {"missing_feature": (
            "`dimension_semantics` is `{after}` at line {line}: no grid axis is marked parallel, and the task "
            "requires a parallel grid so megacore chips can split it across TensorCores.",
            "Every axis is \"arbitrary\" in `{after}`, so the grid cannot be shared between TensorCores; the "
            "task asks for a parallel axis.")},
        ("Mark the independent output axes \"parallel\" and keep only the reduction axis \"arbitrary\".",
         "Use \"parallel\" for each axis whose steps do not depend on each other.")),
    "wrong_pallas_kwarg": Story(
        {s: ("`{api}` has no keyword `{wrong}=`: the parameter is spelled `{kwarg}`.",
             "The call to `{api}` at line {line} passes `{wrong}=`, a keyword it does not accept.",
             "`{wrong}` is not one of `{api}`'s parameters; Python raises a TypeError when the call runs.")
         for s in ("lowering_error", "import_error")},
        ("Pass it as `{kwarg}=`.", "Rename the keyword to `{kwarg}`."),
        {"lowering_error": r"unexpected keyword", "import_error": r"unexpected keyword"}),
    "api_drift": Story(
        {s: ("`{after}` at line {line} is not part of the installed Pallas API{drift_detail}",
             "Line {line} uses `{after}`{drift_detail}",
             "The kernel is written against another Pallas release: `{after}` (line {line}){drift_detail}")
         for s in ("lowering_error", "import_error")},
        ("{drift_fix}",),
        {"lowering_error": r"attribute|not iterable|TypeError", "import_error": r"attribute|TypeError"}),
    "wrong_out_dtype": Story(
        {"wrong_shape": (
            "`out_shape` declares `{new}` at line {line}, so the kernel's result has that dtype whatever its "
            "values, and it does not match the signature.",
            "The output is declared `{new}` (line {line}) where the reference returns `{old}`.",
            "`jax.ShapeDtypeStruct(..., {new})` gives the output the wrong dtype."),
         "lowering_error": (
            "`out_shape` declares `{new}` at line {line}, but the kernel stores `{old}` values into that "
            "output; a ref store does not cast, so tracing rejects the mismatch.",
            "The output ref is `{new}` (line {line}) while the kernel computes it as `{old}`, and the store "
            "into it fails the dtype check.")},
        ("Declare the output with `{old}`.", "Use `{old}` in the `ShapeDtypeStruct`."),
        {"lowering_error": r"dtype"}),
    "unsupported_op": Story(
        {"lowering_error": (
            "`{after}` at line {line} computes the reduction with `{op}`, which has no Mosaic lowering inside a "
            "Pallas TPU kernel, so lowering fails even though the math is right.",
            "Mosaic cannot lower `{op}` in a kernel body; `{after}` is a roundabout reduction that the TPU "
            "backend rejects.",
            "The kernel uses `{op}` at line {line}, an op TPU Pallas does not support.")},
        ("Use the plain reduction `{before}`, which lowers to lane reductions.",
         "Reduce with `{reduction}(..., keepdims=True)` directly."),
        {"lowering_error": r"[Uu]nimplemented|sort|cumsum"}),
    "scalar_store": Story(
        {"lowering_error": (
            "`{source_line}` stores a single scalar into `{ref}`. Mosaic cannot store scalars to VMEM: stores "
            "are whole vectors (tiles of at least one row), so lowering fails.",
            "Line {line} reduces to one number and writes it at `[0, 0]`; VMEM refs only take vector stores.",
            "`{ref}[0, 0] = ...` is a scalar store into a VMEM block, which the TPU lowering refuses.")},
        ("Keep the reduction as a block with `keepdims=True` and store it into the whole row slice, as "
         "`{before}`.",
         "Store a vector: `{before}`."),
        {"lowering_error": r"[Ss]calar"}),
    "block_rank_mismatch": Story(
        {"lowering_error": (
            "The BlockSpec at line {line} has block shape `{shape}`, rank {rank}, for an operand of rank "
            "{full_rank}: one leading dim is missing from the block and from its index map.",
            "`{shape}` at line {line} describes a {rank}-d block, but the array it tiles has {full_rank} dims; "
            "a block shape needs one entry per array dim.",
            "Line {line}'s BlockSpec forgets the leading axis: its block shape and index map describe {rank} "
            "dims of an operand that has {full_rank}.")},
        ("Give the block one entry per array dim (use `None` or 1 for an axis taken one at a time) and "
         "return an index for every dim from the index map.",
         "Add the leading dim back to both the block shape and the index map's result."),
        {"lowering_error": r"number of dimensions|rank"}),
    "unsliced_padding": Story(
        {"wrong_shape": (
            "`{function}` pads its operands to whole blocks and returns `{padded}` as it is: the result keeps "
            "the padded shape instead of the true one.",
            "The kernel runs on padded arrays, and `{function}` returns the padded output `{padded}` without "
            "cutting it back, so its shape is wrong at the ragged cases.",
            "Padding in `{function}` is never undone: `return {padded}` hands back extra rows or columns."),
         "lowering_error": (
            "`{function}` pads its operands to whole blocks and returns `{padded}` without slicing it back, so "
            "the caller's reshape to the true shape fails: the padded result has more elements.",
            "The padded output `{padded}` leaves `{function}` uncut, and reshaping it to the requested shape "
            "cannot work because the sizes differ.")},
        ("Slice back to the true size: `return {sliced}`.", "Return `{sliced}`."),
        {"lowering_error": r"cannot reshape"}),
    "missing_scale": Story(
        {"wrong_output": (
            "`{function}` leaves `{factor}` out of `{kept}`: the result is off by that factor everywhere.",
            "The product at line {line} is missing its `{factor}` factor, so every value is scaled wrongly.",
            "Line {line} computes `{kept}` but never multiplies by `{factor}`, which the reference does.")},
        ("Multiply by `{factor}` where the reference does.", "Apply `* {factor}` at line {line}.")),
    "wrong_derivative": Story(
        {"wrong_output": (
            "The gradient at line {line} drops the term `{term}`: `{kept}` alone is not the derivative.",
            "Line {line} computes `{kept}` where the chain rule gives a second term, `{term}`, so the gradients "
            "are wrong.",
            "The backward formula in `{function}` is incomplete: it keeps `{kept}` and leaves out `{term}`.")},
        ("Include the missing term (`{before}`).", "Use the full derivative, `{before}`.")),
    "truncated_answer": Story(
        {s: ("The answer stops in the middle of line {line} (`{last}`), inside `{function}`, and the code "
             "block is never closed, so there is no complete module to run.",
             "This module is cut off at line {line}: the last statement is unfinished and everything after "
             "it is missing.",
             "The code ends mid-statement at line {line}, as if the answer ran out of room.")
         for s in ("extraction_error", "syntax_error")},
        ("Write the complete module, closing every call, and close the code block.",
         "Give the whole module again, more compactly if needed, ending with the closing fence.")),
    "interpret_flag": Story(
        {"policy_violation": (
            "`interpret=True` in the `pl.pallas_call` at line {line} runs the kernel as a Python emulation "
            "instead of compiling it for the TPU, and the grader refuses it.",
            "The call at line {line} asks for interpret mode; kernels here must compile for TPU, and the "
            "grader picks interpretation by itself when no TPU is present.")},
        ("Leave `interpret=` out of the call.", "Remove the `interpret=True` argument.")),
    "hallucinated_import": Story(
        {"import_error": (
            "Line {line} imports `{fake}` from `jax.experimental.pallas`, and no such module exists, so the "
            "module fails on import.",
            "`{module}` is not a real module: the import at line {line} fails before any kernel is defined.")},
        ("TPU-specific Pallas APIs live in `jax.experimental.pallas.tpu`: `from jax.experimental.pallas "
         "import tpu as pltpu`.",
         "Import `tpu` from `jax.experimental.pallas` (as `pltpu`)."),
        {"import_error": r"[Ii]mport"}),
    "program_id_axis": Story(
        {s: ("`pl.program_id({wrong})` at line {line} reads the wrong grid axis: the code means axis {axis}, "
             "so offsets, masks or first/last-step logic fire on the wrong steps.",
             "`{function}` asks for `pl.program_id({wrong})` where its logic is about grid axis {axis}.",
             "Line {line} takes its position from grid axis {wrong}, not {axis}, so the steps it singles out "
             "are the wrong ones.")
         for s in ("wrong_output", "runtime_error")},
        ("Use `pl.program_id({axis})`.", "Read the index of axis {axis}: `pl.program_id({axis})`.")),
    "overwrite_accumulator": Story(
        {"wrong_output": (
            "`{source_line}` assigns to `{acc}` on every step instead of adding to it, so only the last "
            "step's partial result survives.",
            "`{acc}` is overwritten with `=` at line {line}; the reduction keeps just its final partial sum.",
            "Line {line} replaces `{acc}` with the current step's product, which discards the earlier steps.")},
        ("Accumulate with `+=`.", "Use `{acc}[...] += ...` so each step adds its share.")),
    "plain_jax": Story(
        {"no_kernel": (
            "This `kernel` is plain jax.numpy: it never calls `pl.pallas_call`, so nothing runs as a Pallas "
            "kernel.",
            "The module computes the result with jax.numpy only; the task asks for the arithmetic inside a "
            "Pallas kernel.")},
        ("Move the arithmetic into a kernel body called through `pl.pallas_call`, tiled with BlockSpecs over "
         "a grid.",
         "Write a Pallas kernel for the computation and call it with `pl.pallas_call`.")),
    "copy_kernel_shortcut": Story(
        {s: ("The whole result is computed with jax.numpy before any kernel runs; `_copy_kernel` only copies "
             "it, so the task's arithmetic never happens in Pallas.",
             "`kernel` calls the jax.numpy reference and passes its output through `_copy_kernel`, a kernel "
             "that does no work.")
         for s in ("work_outside_kernel", "compile_error", "lowering_error")},
        ("Put the arithmetic in the kernel body; outside it only pad, reshape and slice.",
         "Do the computation inside the Pallas kernel instead of copying a finished result.")),
    "literal_block_size": Story(
        {"lowering_error": (
            "`{name}` is the literal {value} (line {line}), and the BlockSpecs use it as a block dimension. TPU "
            "blocks are whole (8, 128) tiles: {value} is not a multiple of the tile along that dim and not the "
            "array's full size, so lowering fails.",
            "The block size {value} at line {line} reads like a round number, but Mosaic needs the last two dims "
            "of a block to be multiples of 8 and 128 unless they span the full array dim, and {value} is neither.",
            "`{source_line}` fixes `{name}` at {value}. A block dimension of {value} does not fill whole (8, 128) "
            "tiles, so the kernel cannot be tiled for the TPU.")},
        ("Compute `{name}` from the array's shape instead of a literal: a whole number of tiles along its "
         "dim, capped by the array's size, or the full dim.",
         "Derive `{name}` from the shape, aligned to the tile along its dim unless it spans the full dim, "
         "rather than writing a round number."),
        {"lowering_error": r"divisible by 8 and 128"}),
    "oversized_block": Story(
        {"compile_error": (
            "`{name}` is the literal {value} (line {line}). At the largest bench shape, blocks that size need "
            "about {need_mib} MiB of VMEM with double buffering, more than the {limit_mib} MiB available.",
            "A block of {value} rows (`{source_line}`) is too large for VMEM at the bench sizes: about "
            "{need_mib} MiB against a budget of {limit_mib} MiB.",
            "With `{name}` = {value}, each pipelined operand holds two blocks that size, and at the bench shape "
            "they add up to roughly {need_mib} MiB, over the {limit_mib} MiB of VMEM.")},
        ("Size `{name}` from the shape and a VMEM budget instead of a literal: more grid steps, each one "
         "fitting in VMEM.",
         "Derive `{name}` from the array's shape, capped so the blocks fit in VMEM; smaller blocks only add "
         "grid steps."),
        {"compile_error": r"needs at least [\d.]+ MiB of VMEM"}),
    "traced_slice": Story(
        {"lowering_error": (
            "`{lo}:` ... at line {line} slices with Python slice syntax, but `{lo}` is a traced value inside "
            "the kernel, and a Python slice needs its bounds while the kernel is traced.",
            "The slice at line {line} starts at `{lo}`, which is only known when the kernel runs; Python "
            "slicing of a ref cannot take a traced bound.",
            "Line {line} indexes with `{lo}:...`, a slice whose start is traced. Dynamic offsets into a ref "
            "are written with `pl.ds`.")},
        ("Use `pl.ds({lo}, {size})`: a dynamic start with a static size.",
         "Index with `pl.ds({lo}, {size})` instead of a Python slice."),
        {"lowering_error": r"TracerBool|boolean conversion|slice indices|__index__|concrete"}),
    "traced_value_slice": Story(
        {"lowering_error": (
            "`{ref}[...][{lo}:...]` at line {line} loads the whole block and then slices the array in Python, "
            "with a start that is traced inside the kernel; a jax array's Python slice needs static bounds.",
            "Line {line} slices a loaded array at `{lo}`, a value known only when the kernel runs, and Python "
            "slicing of an array cannot take a traced bound.",
            "The slice at line {line} starts at the traced `{lo}`. Dynamic windows are read from the ref with "
            "`pl.ds`, not cut from a loaded array.")},
        ("Read the window from the ref: `{ref}[pl.ds({lo}, {size})]`.",
         "Index the ref with `pl.ds({lo}, {size})` instead of loading it whole and slicing."),
        {"lowering_error": r"[Ss]lice (indices|entries) must|__index__|concrete|TracerInteger|TracerBool|boolean conversion"}),
    "missing_in_spec": Story(
        {"lowering_error": (
            "The `pl.pallas_call` in `{function}` gets {count} operands but its `in_specs` list has one "
            "BlockSpec fewer: the last operand has no spec.",
            "`in_specs` at line {line} must hold one BlockSpec per operand passed to the kernel, and it is "
            "one short, so the specs and the inputs do not match.",
            "One operand of the call in `{function}` is left without a BlockSpec: `in_specs` lists fewer "
            "specs than the call has inputs.")},
        ("Add the missing spec for the last operand, `{dropped}`, at the end of `in_specs`.",
         "Give the last operand its BlockSpec again: `{dropped}`."),
        {"lowering_error": r"in_specs"}),
    "captured_constant": Story(
        {"lowering_error": (
            "`{param}` is bound into the kernel as `jnp.float32({value})`, a jax array. The kernel then "
            "closes over an array constant, which `pallas_call` refuses: kernel operands must come in as refs.",
            "At line {line}, `functools.partial` passes `{param}` as a jax array. A Pallas kernel may not "
            "capture array constants; a Python float is folded into the kernel as a literal instead.",
            "Wrapping `{param}` in `jnp.float32(...)` (line {line}) makes it an array the kernel captures, "
            "and captured constants are an error in a Pallas kernel.")},
        ("Pass the plain Python number: `{param}={value}`.",
         "Bind `{param}={value}` as a Python scalar; it becomes a constant in the kernel."),
        {"lowering_error": r"captures constants"}),
    "dropped_keepdims": Story(
        {"lowering_error": (
            "`{source_line}` reduces over axis {axis} without `keepdims=True`: the result has one dim fewer "
            "than the block it is combined with or stored into, so the shapes do not agree.",
            "The `{reduction}` at line {line} drops the reduced axis, and the code uses its result as if that "
            "axis were still there: a [rows] vector where a [rows, 1] column belongs.",
            "Line {line}'s reduction returns a result of lower rank than the code expects, so combining or "
            "storing it fails on the shapes.")},
        ("Keep the reduced axis: `{before}`.", "Add `keepdims=True` to the reduction: `{before}`."),
        {"lowering_error": r"[Ii]ncompatible shapes|broadcast|Invalid shape"}),
    "transposed_operand": Story(
        {"lowering_error": (
            "`{after}` at line {line} transposes the right operand, so its contracting dim does not match "
            "the left operand's last dim.",
            "The matmul at line {line} contracts the left operand's columns with the rows of `{after}`, and "
            "after the `.T` those sizes differ.",
            "The blocks already have the layout the matmul needs; the `.T` on `{operand}` at line {line} "
            "swaps its dims and breaks the contraction.")},
        ("Use `{operand}` as it is, without `.T`.", "Drop the transpose: `jnp.dot(..., {operand}, ...)`."),
        {"lowering_error": r"dot_general requires contracting"}),
    "triton_primitive": Story(
        {"lowering_error": (
            "`pl.broadcast_to` at line {line} is a primitive of the GPU (Triton) backend of Pallas, and the "
            "TPU lowering does not have it.",
            "Line {line} uses `pl.broadcast_to`, which only exists for Pallas on GPU.")},
        ("Build the value with `jax.numpy` (`{old}`), which works inside TPU kernels.",
         "Write `{old}` instead; `pl.broadcast_to` exists only for Pallas on GPU."),
        {"lowering_error": r"Triton"}),
    "missing_import": Story(
        {s: (
            "The module uses `{name}` but never imports it, so the first line that needs it raises a NameError.",
            "`{name}` is not defined: the import it needs (`{statement}`) is missing from the top of the "
            "module.",
            "Nothing in the module binds `{name}`, which the code uses, so it fails as soon as that code runs.")
         for s in ("import_error", "lowering_error")},
        ("Add `{statement}` with the other imports.", "Import it: `{statement}`."),
        {"import_error": r"is not defined", "lowering_error": r"is not defined"}),
    "wrong_entry_point": Story(
        {"import_error": (
            "The entry point is called `{name}` (line {line}); the grader calls a function named `kernel`, and "
            "the module defines none.",
            "`{name}` is the right function under the wrong name: the required entry point is `kernel`.")},
        ("Name the function `kernel`.", "Rename `{name}` to `kernel`."),
        {"import_error": r"callable `kernel`"}),
    "prose_in_code": Story(
        {"syntax_error": (
            "Line {line} of the code block is a sentence, `{text}`, not Python, so the module does not parse.",
            "The code block carries prose at line {line} (`{text}`); everything inside the fence must be "
            "code.")},
        ("Keep explanations outside the code block, or make them `#` comments.",
         "Remove the prose line from the code."),
        {"syntax_error": r"invalid syntax"}),
}

_DRIFT = {
    "compiler_params": (": `TPUCompilerParams` is an older name, and this jax has only `pltpu.CompilerParams`.",
                        "Use `pltpu.CompilerParams(...)` with the same arguments."),
    "memory_space": (": `TPUMemorySpace` is gone from `pltpu` in this jax; memory spaces are `pl.ANY`, "
                     "`pltpu.VMEM` and `pltpu.SMEM`.",
                     "Write `{new}` for an operand left in HBM."),
    "blockspec_order": (": `pl.BlockSpec` takes the block shape first and the index map second, so the "
                        "lambda lands where the shape belongs.",
                        "Write `pl.BlockSpec({shape}, index_map)`, shape first."),
}

_SECOND = ("Fixing that alone is not enough. ", "There is a second bug behind it. ",
           "A second problem shows once that is fixed: ", "Separately, ")


def _pick(options: tuple[str, ...], key: str) -> str:
    return options[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(options)]


def observed_facts(verdict: Verdict) -> dict[str, str]:
    """Facts taken from the verdict's typed fields: the failing case's sizes and the VMEM figures."""
    facts = {"case": "", "need_mib": "?", "limit_mib": "?"}
    if verdict.failing_case is not None:
        facts["case"] = verdict.failing_case.sizes()
    if verdict.vmem is not None:
        facts["need_mib"] = f"{verdict.vmem.need_bytes / MiB:.0f}"
        facts["limit_mib"] = f"{verdict.vmem.limit_bytes / MiB:.0f}"
    return facts


def diagnose(mutant: Mutant, verdict: Verdict) -> tuple[str, str] | None:
    """(diagnosis, fix) for a single bug as observed, or None when the story does not cover it."""
    story = _STORIES.get(mutant.operator)
    if story is None:
        return None
    key = next((k for k in (f"{verdict.status}/{mutant.facts.get('where')}", verdict.status)
                if k in story.diagnoses), None)
    if key is None or not re.search(story.evidence.get(key, ""), verdict.message):
        return None
    # code quoted inside a sentence reads as one line
    facts = {k: " ".join(v.split()) for k, v in {**mutant.facts, **observed_facts(verdict)}.items()}
    if mutant.operator == "api_drift":
        detail, fix = _DRIFT[facts["kind"]]
        facts.update(drift_detail=detail, drift_fix=fix.format(**facts))
    templates = story.diagnoses[key]
    if "{need_mib}" in "".join(templates) and facts["need_mib"] == "?":
        return None
    pick = f"{mutant.id}:{verdict.status}"
    return _pick(templates, pick).format(**facts), _pick(story.fixes, pick[::-1]).format(**facts)


def explain(mutant: Mutant, verdict: Verdict, part_verdicts: tuple[Verdict, ...] = ()) -> str | None:
    """The explanation for a failing mutant, or None when no true one can be written.

    A compound mutant explains its first part as the evaluator observed it, then its second part
    as that part fails on its own (`part_verdicts`, one per part)."""
    if not mutant.parts:
        found = diagnose(mutant, verdict)
        return f"{found[0]} {found[1]}" if found else None
    first = diagnose(mutant.parts[0], verdict)
    second = diagnose(mutant.parts[1], part_verdicts[1]) if len(part_verdicts) > 1 else None
    if not (first and second):
        return None
    opener, body = _pick(_SECOND, mutant.id), second[0]
    if opener.endswith(": ") and not body.startswith("`"):
        body = body[0].lower() + body[1:]
    return f"{first[0]} {first[1]}\n\n{opener}{body} {second[1]}"
