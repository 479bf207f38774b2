"""Rules for the text of a Fixit row, checked on every row the collector keeps.

The model reads the feedback and is trained on the explanation, so neither may carry what it
cannot use or should not learn: paths of this machine, the run's seeds, the evaluator's internal
stage names, a narration of how the bug was made ("became", "was removed"), a sentence copied
from the feedback, names of code that is not in the failing kernel, or a hedge (alternative
fixes offered in case the first is wrong). The collector drops a row
that breaks one (`violations`), the dataset card counts them, and tests/test_dataset_rules.py
checks the committed dataset.
"""
from __future__ import annotations

import builtins
import keyword
import re
from collections import Counter
from collections.abc import Iterable
from functools import cache

from evaluator.stages import STAGE_NAMES

RULES = ("local_path", "seed", "stage_name", "history_verb", "copied_feedback", "unknown_name", "hedge")

_LOCAL_PATH = re.compile(r"site-packages|dist-packages|\.venv|(?<![\w.>])/(?:home|work|tmp|usr|root|opt|var|"
                         r"Users|private)/")
_SEED = re.compile(r"\bseeds? \d+|\bseed=\d+", re.IGNORECASE)
_STAGE = re.compile(r"\bstages?\b|" + "|".join(rf"`{name}`" for name in STAGE_NAMES), re.IGNORECASE)
_HISTORY = re.compile(r"\b(?:became|no longer|used to|originally|(?:was|were|has been|have been) "
                      r"(?:removed|dropped|deleted|raised|lowered|changed|replaced|swapped|renamed|added|"
                      r"introduced|moved|shifted|rewritten|turned))\b", re.IGNORECASE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# An explanation states one fix; alternatives offered in case it is wrong are a guess, not a diagnosis.
_HEDGE = re.compile(r"\((?:or|and/or) |\b(?:either|perhaps|probably|possibly|might|maybe)\b|\bor -inf\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOCATION = re.compile(r"\(at candidate\.py line \d+:.*?\)$", re.MULTILINE)
# Names an explanation may use without the failing kernel defining them: the libraries' own.
_LIBRARY_ROOTS = {"jnp", "jax", "pl", "pltpu", "lax", "np", "math", "functools", "numpy"}
_KNOWN = (set(dir(builtins)) | set(keyword.kwlist) | _LIBRARY_ROOTS
          | {"index_map", "a", "b", "keepdims", "axis", "kernel", "tpu", "TracerBoolConversionError",
             "float32", "bfloat16", "float16", "int8", "int32"})


@cache
def _api_parameters() -> set[str]:
    """Parameter names of the Pallas entry points: naming one is naming the API, not our code."""
    import inspect

    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return {p for api in (pl.pallas_call, pl.BlockSpec, pltpu.CompilerParams, pltpu.PrefetchScalarGridSpec)
            for p in inspect.signature(api).parameters}
SHINGLE = 8  # words in a row shared with the feedback that count as a copied sentence


def prose(text: str) -> str:
    """Text without fenced code blocks."""
    return re.sub(r"```.*?(```|\Z)", " ", text, flags=re.DOTALL)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def unknown_names(explanation: str, failing_code: str) -> list[str]:
    """Names in the explanation's code spans that the failing kernel does not contain."""
    present = set(_WORD.findall(failing_code)) | _api_parameters()
    out = []
    for span in _CODE_SPAN.findall(explanation):
        code = re.sub(r"\"[^\"]*\"|'[^']*'", "", span.strip("`"))
        # `b=2, s=276` names a case's sizes, not code
        for match in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*(?!\w*=\d)", code):
            name = match.group(1)
            if name not in present and name not in _KNOWN and not name.isupper():
                out.append(name)
    return out


def violations(feedback: str, explanation: str, failing_code: str) -> list[str]:
    """The rules a row breaks (names from RULES): `feedback` is the user turn that carries the
    evaluator's message, `explanation` the prose of the repair."""
    text = f"{feedback}\n{explanation}"
    found = []
    if _LOCAL_PATH.search(text):
        found.append("local_path")
    if _SEED.search(text):
        found.append("seed")
    if _STAGE.search(explanation):
        found.append("stage_name")
    if _HISTORY.search(explanation):
        found.append("history_verb")
    said = _shingles(_words(_LOCATION.sub("", feedback)))
    if said & _shingles(_words(_CODE_SPAN.sub(" ", explanation))):
        found.append("copied_feedback")
    if unknown_names(explanation, failing_code):
        found.append("unknown_name")
    if _HEDGE.search(_CODE_SPAN.sub(" ", explanation)):
        found.append("hedge")
    return found


def row_violations(row: dict) -> list[str]:
    """`violations` of a dataset row (its messages and failing code)."""
    messages = row["messages"]
    return violations(messages[3]["content"], prose(messages[4]["content"]), row["failing_code"])


def opening(explanation: str, words: int = 8) -> str:
    """An explanation's first words, code spans and numbers masked: what a template shares."""
    masked = re.sub(r"\d+(?:\.\d+)?", "#", _CODE_SPAN.sub("`_`", explanation))
    return " ".join(masked.split()[:words])


def opening_share(explanations: Iterable[str]) -> tuple[str, float]:
    """The most common opening and the share of explanations that start with it."""
    counts = Counter(opening(e) for e in explanations)
    if not counts:
        return "", 0.0
    top, n = counts.most_common(1)[0]
    return top, n / sum(counts.values())
