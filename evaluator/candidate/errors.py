"""Turn exceptions into the few lines of feedback a model can act on."""
from __future__ import annotations

import re
import traceback

CANDIDATE_FILENAME = "candidate.py"
MAX_ERROR_CHARS = 700

# Interpret mode re-raises kernel errors wrapped as "INTERNAL: CpuCallback error ...
# Traceback ... IndexError: ..."; the last "SomethingError: text" line is the real one.
_INNER_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$", re.M)


def describe_exception(exc: BaseException, source_lines: list[str] | None = None) -> tuple[str, str]:
    """(error type, short message): the innermost real error plus where in the candidate."""
    etype, text = type(exc).__name__, str(exc).strip()
    inner = _INNER_ERROR.findall(text)
    if inner and ("Traceback" in text or "CpuCallback" in text):
        etype, text = inner[-1][0].split(".")[-1], inner[-1][1].strip()
    where = candidate_location(exc, source_lines)
    if where:
        text = f"{text}\n{where}"
    return etype, shorten(text)


def candidate_location(exc: BaseException, source_lines: list[str] | None) -> str:
    """'candidate.py line 12: o_ref[...] = ...' for the deepest frame in the candidate."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == CANDIDATE_FILENAME]
    if not frames:
        return ""
    frame = frames[-1]
    line = frame.line or ""
    if not line and source_lines and frame.lineno and 0 < frame.lineno <= len(source_lines):
        line = source_lines[frame.lineno - 1].strip()
    return f"(at {CANDIDATE_FILENAME} line {frame.lineno}: {line})"


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: limit - 15].rstrip() + " ... [truncated]"


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def compiler_message(text: str, max_lines: int = 4) -> str:
    """The compiler's useful lines first: drop status prefixes and boilerplate."""
    lines = []
    for raw in text.strip().splitlines():
        line = raw.strip()
        for prefix in ("RESOURCE_EXHAUSTED:", "INTERNAL:", "INVALID_ARGUMENT:", "UNKNOWN:",
                       "XLA:TPU compile permanent error.", "Mosaic failed to compile TPU kernel:"):
            if line.startswith(prefix):
                line = line[len(prefix):].strip()
        if line and not line.startswith(("===", "Traceback", "File ")):
            lines.append(line if len(line) <= 200 else line[:197] + "...")
        if len(lines) >= max_lines:
            break
    return " | ".join(lines)[:MAX_ERROR_CHARS]
