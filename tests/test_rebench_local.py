"""Re-benchmark of local models: a base model and the same model with a LoRA adapter in one run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

for _module in ("peft", "torch", "transformers"):
    require_module(_module, "pip install -e '.[train]'")

from chat.models import _import_failure  # noqa: E402
from training.tiny_model import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def build_adapter(base: Path, out: Path) -> Path:
    """A LoRA adapter over `base` whose weights are random (not the no-op init): the tuned model
    answers differently from its base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(out)
    return out


@pytest.mark.slow
def test_two_local_models_in_one_run(tmp_path):
    """The README's base-vs-tuned command, in a fresh interpreter (as a user runs it, with
    transformers not yet imported when the two models load from their threads)."""
    texts = ["Write a Pallas softmax kernel. ```python\ndef kernel(x): return x\n```"] * 50
    base = build_tiny_model(tmp_path / "tiny-model", texts, vocab_size=300, hidden=32, layers=1)
    adapter = build_adapter(base, tmp_path / "tiny-sft")
    out = tmp_path / "rebench"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "training.rebench", "--model", f"base={base}", "--model", f"tuned={base}+{adapter}",
         "--task", "softmax", "--samples", "1", "--turns", "2", "--max-tokens", "16", "--workers", "1",
         "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["results"]) == {"base", "tuned"}
    for label in ("base", "tuned"):
        softmax = report["results"][label]["train"]["tasks"]["softmax"]
        assert softmax["turns"][0]["asked"] == 1
    answers = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()[1:]]
    assert {a["conversation"].split("|")[0] for a in answers} == {"base", "tuned"}


def test_an_import_error_is_reported_as_itself_unless_the_package_is_missing():
    missing = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert "pip install" in _import_failure(missing)
    broken_install = ModuleNotFoundError("No module named 'transformers.models'", name="transformers.models")
    assert "install" not in _import_failure(broken_install)
    broken = ImportError("cannot import name 'AutoModelForCausalLM' from 'transformers'")
    message = _import_failure(broken)
    assert "cannot import name 'AutoModelForCausalLM'" in message and "install" not in message
    other = ModuleNotFoundError("No module named 'sentencepiece'", name="sentencepiece")
    assert "install" not in _import_failure(other) and "sentencepiece" in _import_failure(other)
