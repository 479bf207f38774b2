"""The catalogue of failure kinds: what model-written Pallas TPU kernels really get wrong.

One entry per kind (`KINDS`): its name, the real error texts it stands for (regular expressions
that match them, on a real TPU as JAXBench's harness reported them and in our own evaluator's
feedback), where those texts were seen, how often GPT-5.3's real failures fall into it, the bug
operators that inject it into a correct kernel and the name of its repairer, by name: the
operators (`data_gen/failures/operators.py`) and the repairers (`data_gen/repairs/repairers.py`)
bind those names to code and check, on import, that every name here is theirs. This module
imports neither, so every step of the pipeline can speak of kinds.

`classify(status, message)` names the kind of one failure from its status and error text. The
same function counts a JAXBench checkout's real failures (`python -m data_gen.catalogue
jaxbench:PATH`) and the rows of our dataset, so the two mixes are compared in one vocabulary.

The real counts are facts read off a checkout and committed here; no run needs the checkout.
They come from `pallas_eval/results/eval_gpt53.json` at github.com/aryatschand/JAXBench commit
ebc95e6 (217 records: 68 correct, 20 failures of their infrastructure, 129 failures of the
kernel), classified by this module's patterns. Gemini 3's files (`eval_gemini3.json`) are
kept out of the tuning: they are the held-out check of the catalogue and its repairers.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

REAL_SOURCE = "JAXBench ebc95e6, pallas_eval/results/eval_gpt53.json (GPT-5.3, one shot, TPU v6e, jax 0.6.2)"
REAL_MODEL = "gpt53"
UNCLASSIFIED = "other"


@dataclass(frozen=True)
class FailureKind:
    """One kind of failure: how it reads, how often real models hit it, how to make and fix it."""

    name: str
    summary: str
    texts: tuple[str, ...]      # regexes of the error texts it stands for (theirs and ours)
    seen: str                   # where those texts were seen
    gpt53: int                  # GPT-5.3's real failures of this kind (REAL_SOURCE)
    operators: tuple[str, ...]  # injectors: bug operators that produce it (data_gen/failures/operators.py)
    repairer: str = ""          # the kind's repairer in data_gen/repairs/repairers.py, "" for none
    # The runtime kinds: the kernel runs and its values are wrong. A real TPU reports all three
    # as wrong output; only an interpret-mode grader tells an out-of-bounds read or a race apart.
    semantic: bool = False

    def matches(self, message: str) -> bool:
        return any(re.search(t, message) for t in self.texts)


_OUR_GRADER = "our evaluator's feedback"
KINDS: tuple[FailureKind, ...] = (
    FailureKind(
        "block_alignment", "a block whose last two dims are not multiples of (8, 128) nor the array's own",
        (r"divisible by 8 and 128", r"Failed to verify layout for Mosaic kernel operand",
         r"Try changing your kernel block shape"),
        "JAXBench GPT-5.3 and Gemini 3 (\"The Pallas TPU lowering currently requires that the last two "
        "dimensions of your block shape are divisible by 8 and 128\"); our lowering stage", 36,
        ("misaligned_block", "literal_block_size"), "block_alignment"),
    FailureKind(
        "vmem_exhaustion", "blocks or whole arrays that do not fit in VMEM",
        (r"memory space vmem", r"would exceed memory \(size=", r"MiB of VMEM", r"vmem capacity"),
        "JAXBench GPT-5.3 (\"Ran out of memory in memory space vmem\", \"Allocation ... would exceed "
        "memory (size=134217728)\"); our VMEM budget check", 9,
        ("vmem_overallocation", "whole_array_block", "oversized_block"), "vmem_exhaustion"),
    FailureKind(
        "traced_bool", "a Python `if`, conditional expression or slice bound on a traced value (a traced "
        "slice bound on a ref fails this way)",
        (r"boolean conversion of traced array", r"TracerBoolConversionError", r"truth value of an array"),
        "JAXBench GPT-5.3 (\"Attempted boolean conversion of traced array\", most inside a "
        "fori_loop body); our tracing stage", 11,
        ("python_if_on_traced", "program_id_branch", "traced_slice"), "traced_bool"),
    FailureKind(
        "traced_index", "a traced value used as a Python slice bound or index",
        (r"slice indices must have static", r"Slice entries must be static", r"__index__\(\) method was called on traced",
         r"Abstract tracer value encountered where concrete value", r"TracerIntegerConversionError",
         r"ConcretizationTypeError"),
        "JAXBench GPT-5.3 (\"Array slice indices must have static start/stop/step\", \"__index__() "
        "method was called on traced array\"); our tracing stage", 7,
        ("traced_value_slice",), "traced_index"),
    FailureKind(
        "unsupported_op", "an op Mosaic cannot lower as written (cumsum, sort, argmax, gather, rev, "
        "dynamic_slice, shape casts)",
        (r"Unimplemented primitive in Pallas TPU lowering", r"Only 2D gather is supported",
         r"unsupported shape cast", r"[Nn]ot implemented: .*lowering|lowering .*not (yet )?(implemented|supported)"),
        "JAXBench GPT-5.3 (\"Unimplemented primitive in Pallas TPU lowering for KernelType.TC: cumsum\", "
        "\"... dynamic_slice\", \"infer-vector-layout: unsupported shape cast\")", 14,
        ("unsupported_op",), "unsupported_op"),
    FailureKind(
        "triton_primitive", "a GPU (Triton) Pallas primitive used on TPU",
        (r"Triton-specific primitive",),
        "JAXBench GPT-5.3 (\"`broadcast_to` is a Triton-specific primitive\")", 2,
        ("triton_primitive",), "triton_primitive"),
    FailureKind(
        "block_rank", "a BlockSpec whose block shape or index map has the wrong number of dims",
        (r"must have the same number of dimensions as the array shape",
         r"Index map function .* must return \d+ values"),
        "JAXBench GPT-5.3 (\"Block shape for args[0] ... must have the same number of dimensions as the "
        "array shape\", \"Index map function ... must return 3 values\")", 9,
        ("block_rank_mismatch",), "block_rank"),
    FailureKind(
        "spec_arity", "`in_specs` or `out_specs` that do not match the operands",
        (r"Pytree for `(in|out)_specs` and `(inputs|outputs|out_shape)` do not match",
         r"in_specs.*(length|mismatch)"),
        "JAXBench GPT-5.3 (\"Pytree for `in_specs` and `inputs` do not match\")", 3,
        ("missing_in_spec",), ""),
    FailureKind(
        "captured_constant", "a jax array closed over by the kernel instead of passed as an operand",
        (r"captures constants",),
        "JAXBench GPT-5.3 (\"The kernel function in the pallas_call ... captures constants\")", 3,
        ("captured_constant",), "captured_constant"),
    FailureKind(
        "api_misuse", "a Pallas call with wrong arguments: a misspelled keyword, a wrong arity, a name "
        "that does not exist or moved",
        (r"unexpected keyword argument", r"missing \d+ required (positional|keyword)", r"takes \d+ positional",
         r"has no attribute '(?!Model'|workload')", r"cannot import name", r"No module named",
         r"object is not callable", r"object is not iterable"),
        "JAXBench GPT-5.3 (\"repeat() missing 1 required positional argument\", \"when() takes 1 "
        "positional argument but 2 were given\", \"'F32Type' object has no attribute\"); "
        "MultiKernelBench (arXiv 2507.17773, 4.2: unexpected keyword arguments, 22.4% of Pallas failures)", 4,
        ("wrong_pallas_kwarg", "api_drift", "hallucinated_import"), "api_misuse"),
    FailureKind(
        "ref_store_mismatch", "a value stored into a ref of another dtype or shape (a scalar, a bfloat16 "
        "accumulator)",
        (r"Invalid (shape|dtype) for `(swap|get|load|store)`", r"32-bit", r"[Ii]nvalid dtype"),
        "JAXBench GPT-5.3 (\"Invalid dtype for `swap`. Ref dtype: bfloat16. Value dtype: float32\", "
        "\"Invalid shape for `swap`\")", 4,
        ("bf16_accumulation", "scalar_store"), "ref_store_mismatch"),
    FailureKind(
        "shape_error", "shapes that do not agree in the jax code itself (broadcasting, contraction, reshape)",
        (r"(?i)incompatible shapes", r"dot_general requires contracting dimensions",
         r"cannot reshape array", r"Cannot broadcast shapes", r"must not be longer than",
         r"transpose requires ndarray", r"'NoneType' object has no attribute 'shape'", r"feature_group_count",
         r"Shape mismatch", r"shapes? .* (do not|must) match"),
        "JAXBench GPT-5.3 (\"Incompatible shapes for broadcasting\", \"dot_general requires contracting "
        "dimensions to have the same shape\", \"cannot reshape array\")", 13,
        ("dropped_keepdims", "transposed_operand"), "shape_error"),
    FailureKind(
        "undefined_name", "a name used but never imported or defined",
        (r"name '\w+' is not defined",),
        "JAXBench Gemini 3 (\"name 'jnp' is not defined\")", 0,
        ("missing_import",), "undefined_name"),
    FailureKind(
        "wrong_entry_point", "no `kernel` function: the entry point has another name",
        (r"has no attribute 'Model'", r"has no attribute 'workload'", r"define a callable `kernel`"),
        "JAXBench Gemini 3 (\"module 'generated' has no attribute 'Model'\"); our loader", 0,
        ("wrong_entry_point",), "wrong_entry_point"),
    FailureKind(
        "prose_in_code", "prose, markdown or a truncated tail inside the module: it does not parse",
        (r"invalid syntax", r"unterminated string literal", r"unexpected indent", r"unmatched '",
         r"was never closed", r"expected an indented block", r"[Nn]o (complete )?```python|code block"),
        "JAXBench Gemini 3 (\"invalid syntax (..., line 1)\", \"unterminated string literal\": prose "
        "around the code); our extraction stage", 0,
        ("truncated_answer", "prose_in_code"), "prose_in_code"),
    FailureKind(
        "interpret_flag", "`interpret=True` left in the pallas_call",
        (r"interpret=True|interpret mode",), _OUR_GRADER, 0, ("interpret_flag",), "interpret_flag"),
    FailureKind(
        "no_pallas", "the work done in jax.numpy, with no Pallas kernel or only a copy kernel",
        (r"no Pallas|does not call pl\.pallas_call|outside the kernel|work outside", r"copy kernel"),
        _OUR_GRADER + " (JAXBench does not check that Pallas is used)", 0,
        ("plain_jax", "copy_kernel_shortcut"), "work_outside"),
    FailureKind(
        "missing_feature", "a required hardware feature not used (every grid axis arbitrary)",
        (r"required feature|must use|parallel",), _OUR_GRADER, 0, ("no_parallel_axis",), ""),
    FailureKind(
        "wrong_values", "the kernel runs and its values are wrong (masks, index maps, accumulators, scales, "
        "dtypes, derivative terms)",
        (r"wrong_output", r"[Mm]ismatch|relative L2|wrong values|max_diff"),
        "JAXBench GPT-5.3 (runs, fails their allclose)", 10,
        ("index_map_swap", "floor_grid", "drop_mask", "drop_accumulator_init", "drop_finalize",
         "no_running_max", "off_by_one_comparison", "overwrite_accumulator", "missing_scale", "wrong_derivative",
         "unsliced_padding", "program_id_axis", "wrong_out_dtype"), "wrong_values", semantic=True),
    FailureKind(
        "out_of_bounds", "a read or write past the end of an array (a shifted index map)",
        (r"[Oo]ut-of-bounds|out of bounds",),
        _OUR_GRADER + " (a real TPU reads the neighbouring memory and reports wrong output)", 0,
        ("index_map_shift",), "wrong_values", semantic=True),
    FailureKind(
        "race", "a DMA never waited or a buffer overwritten while it is read",
        (r"\b[Rr]aces?\b|never waited|semaphore",),
        _OUR_GRADER + " (a real TPU reports wrong output, or nothing, depending on timing)", 0,
        ("dma_never_waited", "double_buffer_race"), "", semantic=True),
)
KIND_NAMES = tuple(k.name for k in KINDS)
# GPT-5.3 failures no pattern matches (an AssertionError with no text, a NotImplementedError,
# a crash dump): counted so the shares add up, injected by nothing.
GPT53_UNCLASSIFIED = 4
GPT53_FAILURES = sum(k.gpt53 for k in KINDS) + GPT53_UNCLASSIFIED

# Statuses that name the kind by themselves, whatever the message says.
_BY_STATUS = {"wrong_output": "wrong_values", "wrong_shape": "wrong_values", "extraction_error": "prose_in_code",
              "syntax_error": "prose_in_code", "no_kernel": "no_pallas", "work_outside_kernel": "no_pallas",
              "missing_feature": "missing_feature"}
# Kinds whose text patterns are checked first: a specific text beats a generic one.
_ORDER = ("triton_primitive", "captured_constant", "spec_arity", "block_rank", "block_alignment", "vmem_exhaustion",
          "traced_bool", "traced_index", "unsupported_op", "ref_store_mismatch", "undefined_name",
          "wrong_entry_point", "shape_error", "api_misuse", "prose_in_code", "out_of_bounds", "race",
          "interpret_flag")


def kind(name: str) -> FailureKind:
    for k in KINDS:
        if k.name == name:
            return k
    raise KeyError(f"unknown failure kind {name!r}; known: {', '.join(KIND_NAMES)}")


def classify(status: str, message: str) -> str:
    """The kind of one failure, from its status (ours, or "wrong_output" for a real run that
    gave wrong values) and its error text; UNCLASSIFIED when nothing matches."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status == "policy_violation" and re.search(r"interpret", message):
        return "interpret_flag"
    for name in _ORDER:
        if kind(name).matches(message):
            return name
    return UNCLASSIFIED


def kind_of_operator(operator_name: str) -> str:
    """The kind a bug operator is written to inject."""
    for k in KINDS:
        if operator_name in k.operators:
            return k.name
    raise KeyError(f"bug operator {operator_name!r} belongs to no failure kind")


# --- the real mix and ours, side by side ----------------------------------------------------------

# On a real TPU, the semantic kinds all read as wrong output: ours are compared as one group.
WRONG_OUTPUT_GROUP = "wrong_values"


def comparison_group(kind_name: str) -> str:
    """The group a kind is compared in: the runtime kinds as one, a name not in the catalogue
    (a row written before kinds were recorded) as unclassified."""
    if kind_name not in KIND_NAMES:
        return UNCLASSIFIED
    return WRONG_OUTPUT_GROUP if kind(kind_name).semantic else kind_name


def grouped(kinds: Counter) -> Counter:
    """A count of kinds as a count of comparison groups."""
    out: Counter[str] = Counter()
    for name, n in kinds.items():
        out[comparison_group(name)] += n
    return out


def real_counts() -> Counter:
    """GPT-5.3's 129 real kernel failures by comparison group."""
    return grouped(Counter({**{k.name: k.gpt53 for k in KINDS}, UNCLASSIFIED: GPT53_UNCLASSIFIED}))


def real_mix() -> dict[str, float]:
    """GPT-5.3's real failure mix by comparison group."""
    return mix_of(real_counts())


def mix_of(kinds: Counter) -> dict[str, float]:
    """Shares by comparison group of a count of kinds (or of groups)."""
    counts = grouped(kinds)
    total = sum(counts.values())
    return {g: n / total for g, n in counts.items()} if total else {}


def total_variation(a: dict[str, float], b: dict[str, float]) -> float:
    """Half the L1 distance between two mixes: the share of one that must move to make the other."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
