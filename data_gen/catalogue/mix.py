"""The dataset's mix of failure kinds, calibrated to the real one.

The real mix is GPT-5.3's one-shot failures on JAXBench, counted by the failure catalogue
(data_gen/catalogue/kinds.py). The target departs from it in three stated ways:

- no kind above MAX_KIND_SHARE of the rows: the largest real kind (blocks not aligned to the
  (8, 128) tile, 28%) would otherwise be what a model learns first and best;
- the runtime kinds (wrong values, out-of-bounds, races) get SEMANTIC_SHARE, about two and a half
  times their real 8%. A repair loop meets them more often than one-shot counts show: they are
  what is left once a kernel compiles, their feedback does not name the fix, and only a grader
  that runs kernels (ours, in interpret mode) can label them at all;
- the answers that never reach the compiler (prose in the code, a wrong entry point, a missing
  import, interpret mode left on, no Pallas at all) get SURFACE_SHARE together: GPT-5.3 made
  none of them, Gemini 3 made many.

`data_gen.rows.dataset.calibrate` keeps as many rows as it can whose mix is within TV_LIMIT (total
variation) of the real one, with no kind above the cap.
"""
from __future__ import annotations

from collections import Counter

from data_gen.catalogue.kinds import GPT53_FAILURES, KINDS, REAL_SOURCE, grouped, mix_of, real_counts, total_variation

MAX_KIND_SHARE = 0.15
SEMANTIC_SHARE = 0.20
SURFACE_SHARE = 0.04
TV_LIMIT = 0.25
_SEMANTIC_SPLIT = {"wrong_values": 0.14, "out_of_bounds": 0.05, "race": 0.01}


def target_mix() -> dict[str, float]:
    """The share of rows each kind should have (kinds without an injector get none)."""
    injectable = [k for k in KINDS if k.operators]
    target = {k.name: SEMANTIC_SHARE * _SEMANTIC_SPLIT[k.name] / sum(_SEMANTIC_SPLIT.values())
              for k in injectable if k.semantic}
    surface = [k.name for k in injectable if not k.semantic and k.gpt53 == 0]
    target.update({name: SURFACE_SHARE / len(surface) for name in surface})
    # the rest, in proportion to the real counts, with the cap filled like water: a capped kind's
    # excess goes to the others in proportion
    static = {k.name: float(k.gpt53) for k in injectable if not k.semantic and k.gpt53 > 0}
    room = 1.0 - sum(target.values())
    while static:
        scale = room / sum(static.values())
        over = {name for name, n in static.items() if n * scale > MAX_KIND_SHARE}
        if not over:
            target.update({name: n * scale for name, n in static.items()})
            break
        for name in over:
            target[name] = MAX_KIND_SHARE
            room -= MAX_KIND_SHARE
            del static[name]
    return target


def mix_table(kinds: Counter) -> str:
    """Markdown: each comparison group, our rows and share, GPT-5.3's failures and share, and the
    total variation between the two mixes."""
    ours, theirs = grouped(kinds), real_counts()
    ours_mix, real = mix_of(ours), mix_of(theirs)
    groups = sorted(set(ours) | set(theirs), key=lambda g: (-real.get(g, 0.0), -ours_mix.get(g, 0.0), g))
    lines = ["| failure kind | rows | ours (%) | GPT-5.3 failures | GPT-5.3 (%) |", "|---|---:|---:|---:|---:|"]
    for g in groups:
        label = "wrong values (wrong_values, out_of_bounds, race)" if g == "wrong_values" else g
        lines.append(f"| {label} | {ours[g]} | {100 * ours_mix.get(g, 0.0):.1f} | {theirs[g]} | "
                     f"{100 * real.get(g, 0.0):.1f} |")
    lines.append(f"| **total** | {sum(ours.values())} | 100 | {GPT53_FAILURES} | 100 |")
    tv = total_variation(ours_mix, real)
    return "\n".join(lines) + (f"\n\nTotal variation distance between the two mixes: **{tv:.3f}** (target at most "
                               f"{TV_LIMIT}). Real counts: {REAL_SOURCE}.")


def semantic_share(kinds: Counter) -> float:
    """Share of rows in the runtime kinds: the kernel runs and its values are wrong."""
    total = sum(kinds.values())
    semantic = {k.name for k in KINDS if k.semantic}
    return sum(n for k, n in kinds.items() if k in semantic) / total if total else 0.0
