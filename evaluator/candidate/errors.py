"""Turn exceptions into the few lines of feedback a model can act on."""
from __future__ import annotations

import re
import traceback

CANDIDATE_FILENAME = "candidate.py"
MAX_ERROR_CHARS = 700

# Interpret mode re-raises kernel errors wrapped as "INTERNAL: CpuCallback error ...
# Traceback ... IndexError: ..."; the last "SomethingError: text" line is the real one.
_INNER_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$", re.M)
_TEXT_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)
# jax's TPU interpret mode, where it cannot do what a kernel asks: its utils.to_range reads only
# NDIndexer transforms ("For now"), so a DMA from a reshaped ref raises AttributeError there.
# Errors the interpreter means to raise about a kernel (out of bounds, a race) are other types.
_INTERPRETER = "/jax/_src/pallas/mosaic/interpret/"
_INTERPRETER_FAULTS = ("AttributeError", "NotImplementedError")
INTERPRETER_FAULT = "InterpreterFault"  # the error type a run reports for one (stages.py: grader_limit)


def describe_exception(exc: BaseException, source_lines: list[str] | None = None) -> tuple[str, str]:
    """(error type, short message): the innermost real error plus where in the candidate."""
    etype, text, _ = _innermost(exc)
    where = candidate_location(exc, source_lines)
    if where:
        text = f"{text}\n{where}"
    return etype, shorten(text)


def interpreter_fault(exc: BaseException) -> bool:
    """Whether jax's interpret mode failed on its own, not on the kernel: an AttributeError or
    NotImplementedError raised in the interpreter's code (the innermost frame; inside a callback,
    the innermost frame of the traceback its text carries)."""
    etype, _, frames = _innermost(exc)
    return etype in _INTERPRETER_FAULTS and bool(frames) and _INTERPRETER in frames[-1].replace("\\", "/")


def _innermost(exc: BaseException) -> tuple[str, str, list[str]]:
    """(type, message, files of its frames, innermost last) of the real error: inside a callback,
    the one the wrapping error's text carries."""
    text = str(exc).strip()
    inner = _INNER_ERROR.findall(text)
    if inner and ("Traceback" in text or "CpuCallback" in text):
        return inner[-1][0].split(".")[-1], inner[-1][1].strip(), _TEXT_FRAME.findall(text)
    return type(exc).__name__, text, [f.filename for f in traceback.extract_tb(exc.__traceback__)]


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
