"""The `--context none|spec|guide` hardware context: numbers match the evaluator's, the ladder is
cumulative, and every Pallas name the guide teaches exists in the installed jax."""
from __future__ import annotations

import ast
import importlib.resources
import inspect
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from chat.context import CHIP_FACTS, CONTEXTS, GUIDE_PATH, guide_text, render_context, ridge_point
from evaluator.performance.hardware import DEFAULT_GENERATION, GENERATIONS, MiB

GUIDE = GUIDE_PATH.read_text(encoding="utf-8")
CODE_BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)
MODULES = {"pl": pl, "pltpu": pltpu, "jnp": jnp, "jax.lax": jax.lax}


def _row(sheet: str, name: str) -> str:
    rows = [line for line in sheet.splitlines() if line.startswith(f"| {name} |")]
    assert len(rows) == 1, f"expected one table row for {name}, got {rows}"
    return rows[0]


def test_contexts_constant():
    assert CONTEXTS == ("none", "spec", "guide")


def test_chip_facts_cover_exactly_the_evaluator_generations():
    assert set(CHIP_FACTS) == set(GENERATIONS) == {"v4", "v5e", "v5p", "v6e", "v7x"}


@pytest.mark.parametrize("target", sorted(GENERATIONS))
def test_spec_sheet_has_every_generation_with_the_evaluator_numbers(target):
    sheet = render_context("spec", target)
    for name, gen in GENERATIONS.items():
        row = _row(sheet, name)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert f"{gen.vmem_bytes // MiB} MiB" in cells
        assert f"{gen.default_scoped_vmem_bytes // MiB} MiB" in cells
        assert f"{gen.hbm_bytes_per_s / 1e9:,.0f} GB/s" in cells
        assert f"{gen.bf16_flops_per_s / 1e12:,.0f} TFLOP/s" in cells
        facts = CHIP_FACTS[name]
        assert f"{facts.mxu}x{facts.mxu}" in cells
        assert f"{facts.hbm_gib_per_chip} GiB" in cells


def test_chip_facts_values():
    assert {n: f.mxu for n, f in CHIP_FACTS.items()} == {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "v7x": 256}
    assert {n: f.cores_per_device for n, f in CHIP_FACTS.items()} == {"v4": 2, "v5e": 1, "v5p": 2, "v6e": 1, "v7x": 1}
    assert CHIP_FACTS["v7x"].cores_per_chip == 2
    assert {n: f.hbm_gib_per_chip for n, f in CHIP_FACTS.items()} == {
        "v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "v7x": 192}


@pytest.mark.parametrize("target", sorted(GENERATIONS))
def test_target_sentence_names_the_chosen_generation(target):
    sheet = render_context("spec", target)
    targets = re.findall(r"Target: (\w+)", sheet)
    assert targets == [target]
    sentence = next(line for line in sheet.splitlines() if "Target:" in line)
    gen = GENERATIONS[target]
    assert f"{gen.default_scoped_vmem_bytes // MiB} MiB" in sentence
    assert f"{ridge_point(gen):.0f} FLOP/byte" in sentence


def test_default_target_and_ridge_point():
    assert re.findall(r"Target: (\w+)", render_context("spec")) == [DEFAULT_GENERATION]
    assert ridge_point(GENERATIONS["v5e"]) == pytest.approx(1.97e14 / 8.2e11)
    assert "240 FLOP/byte" in render_context("spec", "v5e")


def test_sheet_lists_sources():
    sheet = render_context("spec")
    assert "cloud.google.com/tpu/docs" in sheet
    assert "jax/_src/pallas/mosaic/tpu_info.py" in sheet


@pytest.mark.parametrize("target", sorted(GENERATIONS))
def test_none_is_empty(target):
    assert render_context("none", target) == ""


@pytest.mark.parametrize("target", sorted(GENERATIONS))
def test_guide_is_spec_plus_guide(target):
    spec, guide = render_context("spec", target), render_context("guide", target)
    assert guide.startswith(spec)
    assert len(guide) > len(spec) + 5000
    assert guide.endswith(guide_text())
    for topic in ("dimension_semantics", "make_async_copy", "PrefetchScalarGridSpec", "vmem_limit_bytes",
                  "pl.when", "preferred_element_type=jnp.float32", "broadcasted_iota", "pl.cdiv",
                  "SemaphoreType.DMA", "pl.ANY", "TracerBoolConversionError"):
        assert topic in guide, topic
    assert "(8, 128)" in guide or "(8,128)" in guide


@pytest.mark.parametrize("kind, generation", [("full", "v5e"), ("", "v5e"), ("Spec", "v5e"),
                                               ("spec", "v5"), ("guide", "tpu7x"), ("none", "v3")])
def test_unknown_kind_or_generation_raises(kind, generation):
    with pytest.raises(ValueError) as err:
        render_context(kind, generation)
    message = str(err.value)
    assert "\n" not in message
    choices = CONTEXTS if kind not in CONTEXTS else tuple(GENERATIONS)
    assert all(choice in message for choice in choices)


def test_guide_shipped_next_to_the_package():
    resource = importlib.resources.files("chat") / "guide" / "pallas_tpu.md"
    assert resource.read_text(encoding="utf-8") == GUIDE
    assert 150 <= len(GUIDE.splitlines()) <= 260


def _resolve(dotted: str):
    """`pltpu.SemaphoreType.DMA` -> the object, or raise AttributeError naming what is missing."""
    for prefix in sorted(MODULES, key=len, reverse=True):
        if dotted.startswith(prefix + "."):
            obj = MODULES[prefix]
            for part in dotted[len(prefix) + 1:].split("."):
                if not hasattr(obj, part):
                    raise AttributeError(f"{dotted}: {part!r} missing in the installed jax {jax.__version__}")
                obj = getattr(obj, part)
            return obj
    raise KeyError(dotted)


def test_every_api_name_in_the_guide_exists():
    names = set(re.findall(r"\b(?:pl|pltpu|jnp)\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", GUIDE))
    names |= set(re.findall(r"\bjax\.lax\.[A-Za-z_]\w*", GUIDE))
    assert len(names) > 25  # the regexes really see the guide's names
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except AttributeError as e:
            missing.append(str(e))
    assert not missing, missing


def test_guide_code_blocks_parse_and_use_real_keywords():
    assert len(CODE_BLOCKS) >= 6
    bad = []
    for block in CODE_BLOCKS:
        assert "interpret" not in block
        tree = ast.parse(block)  # raises on a syntax error
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.keywords:
                continue
            dotted = ast.unparse(node.func)
            if not dotted.startswith(("pl.", "pltpu.", "jnp.", "jax.lax.")):
                continue
            try:
                params = inspect.signature(_resolve(dotted)).parameters
            except (TypeError, ValueError):  # no introspectable signature
                continue
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                continue
            bad += [f"{dotted}({kw.arg}=)" for kw in node.keywords if kw.arg not in params]
    assert not bad, bad


def test_guide_tells_candidates_not_to_pass_interpret():
    assert "Never pass `interpret=`" in GUIDE
    assert "pltpu.ANY" not in GUIDE and "TPUCompilerParams(" not in GUIDE
