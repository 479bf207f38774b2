"""Many correct kernels per task: the candidates the variant pool verifies.

A task's seeds are its solution (`tasks/<task>/solution.py`) and its hand-written alternatives
(`tasks/<task>/variants/*.py`: other algorithms, other structures). Each seed also yields
semantics-preserving rewrites:

- **blocks**: other legal block sizes, found and rewritten by the tuner's knob finder
  (`evaluator.candidate.knobs`), drawn below the seed's own sizes down to one (8, 128) tile, so that
  check-size cases span several blocks and edge handling is exercised;
- **layout**: every second rewrite also drops the comments (docstrings stay), so the
  repairs a model reads do not all carry the same commentary.

Candidates only propose; the pool (`data_gen/pool.py`) grades each on its task's train cases
and keeps the correct ones. Rewrites whose `fingerprint` equals an earlier candidate's are not
proposed at all: a renamed or re-commented kernel is not a new kernel.
"""
from __future__ import annotations

import io
import itertools
import random
import tokenize
from dataclasses import dataclass, field

from data_gen.failures.fingerprint import fingerprint
from evaluator.candidate.knobs import Knob, alignment, choices, find_knobs, rewrite
from tasks.spec import Task

VARIANTS_DIR = "variants"  # tasks/<task>/variants/*.py: hand-written alternative kernels
_BETWEEN = (384, 640, 768)  # 128-multiples between the powers of two


@dataclass(frozen=True)
class Candidate:
    """A kernel to verify: where it came from and how it was made from its seed."""

    task: str
    name: str     # unique within the task: "solution", "online.blocks-2", ...
    seed: str     # "solution" or the alternative's file stem
    origin: str   # "solution", "alternative" or "rewrite"
    source: str
    recipe: dict = field(default_factory=dict, compare=False, hash=False)  # knobs and layout


def seed_sources(task: Task) -> dict[str, str]:
    """The task's seeds by name: its solution first, then its alternatives in file order."""
    seeds = {"solution": task.solution_source()}
    folder = task.solution_path.parent / VARIANTS_DIR
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        seeds[path.stem] = path.read_text()
    return seeds


def candidates(task: Task, rewrites_per_seed: int) -> list[Candidate]:
    """Every seed, then up to `rewrites_per_seed` rewrites of each, interleaved over seeds so
    a pool that keeps the first N correct ones draws from every seed."""
    seeds = seed_sources(task)
    out = [Candidate(task.name, name, name, "solution" if name == "solution" else "alternative", src,
                     {"knobs": {}, "layout": "as written"}) for name, src in seeds.items()]
    seen = {fingerprint(c.source) for c in out}
    per_seed = [_rewrites(task, name, src, rewrites_per_seed, seen) for name, src in seeds.items()]
    for group in itertools.zip_longest(*per_seed):
        out.extend(c for c in group if c is not None)
    return out


def _rewrites(task: Task, seed: str, source: str, limit: int, seen: set[str]) -> list[Candidate]:
    knobs = find_knobs(source)
    if not knobs or limit <= 0:
        return []
    check_dims = [d for c in task.select("train", "check") for d in c.dims.values()]
    max_dim = max(check_dims, default=128)
    options = [_smaller_values(knob, max_dim) for knob in knobs]
    settings = [dict(zip((k.name for k in knobs), values)) for values in itertools.product(*options)]
    random.Random(f"{task.name}:{seed}").shuffle(settings)
    out: list[Candidate] = []
    for setting in settings:
        if len(out) >= limit:
            break
        if all(setting[k.name] == k.value for k in knobs):
            continue
        layout = "no comments" if len(out) % 2 else "as written"
        text = rewrite(source, knobs, setting)
        if layout == "no comments":
            text = strip_comments(text)
        key = fingerprint(text)
        if key in seen:
            continue
        seen.add(key)
        changed = {name: value for name, value in setting.items()
                   if value != next(k.value for k in knobs if k.name == name)}
        out.append(Candidate(task.name, f"{seed}.blocks-{len(out) + 1}", seed, "rewrite", text,
                             {"knobs": changed, "layout": layout}))
    return out


def _smaller_values(knob: Knob, max_dim: int) -> list[int]:
    """The knob's own value and the aligned sizes below it: the tuner's powers of two plus a
    few 128-multiples between them (384, 640, 768), up to the largest check-size dim."""
    values = {v for v in choices(knob, max_dim) if v <= knob.value}
    values |= {v for v in _BETWEEN if v < knob.value and v <= max_dim and v % alignment(knob) == 0}
    return sorted(values)


def strip_comments(source: str) -> str:
    """The source without `#` comments: comment-only lines go, code lines lose their tail."""
    cut: dict[int, int] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    lines = []
    for number, line in enumerate(source.splitlines(), 1):
        if number in cut:
            code = line[:cut[number]].rstrip()
            if not code:
                continue
            line = code
        lines.append(line)
    return "\n".join(lines) + "\n"
