"""Stage 1: find the candidate's source in a model's answer."""
from __future__ import annotations

import re

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_PYTHON_TAGS = {"", "python", "py", "python3"}


class ExtractionError(ValueError):
    pass


def extract_code(answer: str, entry_point: str = "kernel") -> str:
    """The last fenced python block; a bare source file (no fences) is taken whole.

    A model's answer is prose plus code; the last block is its final word. Text without any
    fence is accepted only when it reads as a module defining `kernel` (or the task's own entry
    point: an imported task's `workload` or `ModelNew`), so that a candidate file can be graded
    as it is.
    """
    blocks = [body for tag, body in _FENCE.findall(answer) if tag.lower() in _PYTHON_TAGS]
    if blocks:
        code = blocks[-1]
        if not code.strip():
            raise ExtractionError("the last ```python block is empty")
        return code
    if "```" in answer:
        raise ExtractionError("no complete ```python code block found in the answer")
    names = "|".join(re.escape(n) for n in {"kernel", entry_point})
    if re.search(rf"^\s*(def|class)\s+({names})\b", answer, re.M):
        return answer
    raise ExtractionError(f"the answer contains no code: expected a ```python block defining {entry_point}(...)")
