"""Our error mix beside published failure mixes of model-written Pallas TPU kernels.

The published figures are per-model failure counts from one-shot generation, in each source's
own categories; ours are shares of repair pairs. Categories are matched through the bug
operators that produce them (`CATEGORIES`). Sources, as read on 2026-11-30:

- JAXBench, EXPERIMENT.md (github.com/aryatschand/JAXBench at ebc95e6): one-shot kernels for 209
  workloads on TPU v6e, JAX 0.6.2. GPT-5.3: 67 correct, 10 wrong output, 132 errors; Gemini 3.1
  Pro: 39 correct, 0 wrong output, 170 errors, by category below.
- MultiKernelBench (arXiv 2507.17773, section 4.2): among failed Pallas runs, "Unexpected
  Keyword Argument (22.4%)" and "blocks of rank >= 1" (5%); no other Pallas split is published
  (no compile / runtime / wrong-output shares).
"""
from __future__ import annotations

from collections import Counter

# (category, our operators producing it, JAXBench GPT-5.3 count, JAXBench Gemini 3.1 Pro count,
#  MultiKernelBench share of Pallas failures or None where it gives no figure)
CATEGORIES: tuple[tuple[str, tuple[str, ...], int, int, float | None], ...] = (
    ("block not a multiple of (8, 128)", ("misaligned_block",), 34, 5, None),
    ("VMEM exhaustion", ("vmem_overallocation", "whole_array_block"), 22, 12, None),
    ("Python branch on a traced value", ("python_if_on_traced", "program_id_branch"), 11, 3, None),
    ("op or store Mosaic cannot lower", ("unsupported_op", "scalar_store"), 10, 6, None),
    ("API misuse: keyword, missing name, argument order",
     ("wrong_pallas_kwarg", "api_drift", "hallucinated_import"), 1, 12, 0.224),
    ("block rank or spec mismatch", ("block_rank_mismatch",), 3, 0, 0.05),
    ("syntax error or truncated answer", ("truncated_answer",), 0, 9, None),
    ("JAXBench's 'Other' (GPT-5.3 log: various Pallas API misuse)", (), 44, 123, None),
    ("timeout or TPU initialisation", (), 7, 0, None),
    ("wrong output (runs, wrong values)", ("wrong_output",), 10, 0, None),
)
JAXBENCH_FAILURES = {"GPT-5.3": 10 + 132, "Gemini 3.1 Pro": 0 + 170}
SEMANTIC_CLASSES = ("wrong_output", "runtime_error")


def semantic_share(by_class: Counter) -> float:
    """Share of pairs whose failing kernel runs and gives wrong values or crashes."""
    total = sum(by_class.values())
    return sum(by_class[c] for c in SEMANTIC_CLASSES) / total if total else 0.0


def mix_table(by_origin: Counter, by_class: Counter) -> str:
    """Markdown: each published category, our share of pairs, and the published shares."""
    total = max(1, sum(by_origin.values()))
    gpt, gemini = JAXBENCH_FAILURES["GPT-5.3"], JAXBENCH_FAILURES["Gemini 3.1 Pro"]
    lines = ["| failure category | our operators | ours (% of pairs) | JAXBench GPT-5.3 (% of 142 failures) | "
             "JAXBench Gemini 3.1 Pro (% of 170) | MultiKernelBench (% of Pallas failures) |",
             "|---|---|---:|---:|---:|---:|"]
    for name, operators, n_gpt, n_gemini, mkb in CATEGORIES:
        if operators == ("wrong_output",):  # a verdict class, not an operator
            ours, named = f"{100 * by_class['wrong_output'] / total:.1f}", "(every pair of class `wrong_output`)"
        else:
            ours = f"{100 * sum(by_origin[o] for o in operators) / total:.1f}" if operators else "none"
            named = ", ".join(f"`{o}`" for o in operators) or "(no counterpart)"
        lines.append(f"| {name} | {named} | {ours} | {100 * n_gpt / gpt:.1f} | {100 * n_gemini / gemini:.1f} | "
                     f"{'no figure' if mkb is None else f'{100 * mkb:.1f}'} |")
    return "\n".join(lines)
