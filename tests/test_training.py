"""training.sft on a tiny offline model: loss mask, overfitting, stopping, adapter save/merge/reload, config errors."""
import json
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_module

for _module in ("trl", "peft", "torch"):
    require_module(_module, "pip install -e '.[train]'")

import torch

import datasets
from training.sft import build_trainer, main, make_parser, train
from training.tiny_model import END_OF_TURN, build_tiny_model


def fixit_row(i: int) -> dict:
    return {"id": str(i), "messages": [
        {"role": "system", "content": "You write Pallas TPU kernels."},
        {"role": "user", "content": f"Write kernel number {i} for softmax."},
        {"role": "assistant", "content": f"```python\nbad_{i} = 1\n```"},
        {"role": "user", "content": f"wrong_output on case {i}: fix it."},
        {"role": "assistant", "content": f"The max was missing in kernel {i}.\n```python\ngood_{i} = 2\n```"},
    ]}


ROWS = [fixit_row(i) for i in range(3)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    data = root / "fixit" / "data"
    data.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(data / "train-00000-of-00001.parquet")
    texts = [m["content"] for r in ROWS for m in r["messages"]] * 20
    build_tiny_model(root / "model", texts, vocab_size=400, hidden=64, layers=2)
    return root


def args_for(workdir: Path, out: str, *extra: str):
    return make_parser().parse_args_and_config([
        "--model_name_or_path", str(workdir / "model"), "--dataset_path", str(workdir / "fixit"),
        "--output_dir", str(workdir / out), "--use_peft", "--lora_r", "16", "--lora_alpha", "32",
        "--lora_dropout", "0.0", "--lora_target_modules", "all-linear", "--report_to", "none",
        "--use_cpu", "--save_strategy", "no", "--eval_strategy", "no", "--per_device_train_batch_size", "3",
        "--logging_steps", "10", "--seed", "0", "--dtype", "float32", *extra])


def test_loss_covers_only_the_last_assistant_message_and_its_end_of_turn(workdir):
    trainer = build_trainer(*args_for(workdir, "mask", "--max_steps", "1"))
    tokenizer = trainer.processing_class
    for row, example in zip(ROWS, trainer.train_dataset):
        ids = example["input_ids"]
        mask = [label != -100 for label in example["labels"]]  # -100: ignored by the loss
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        ignored = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        target = row["messages"][-1]["content"]
        assert trained.startswith(target + END_OF_TURN)
        assert row["messages"][2]["content"] in ignored and target not in ignored


@pytest.fixture(scope="module")
def trained(workdir):
    args = args_for(workdir, "out", "--max_steps", "60", "--learning_rate", "1e-2", "--merge_adapter")
    summary = train(*args)
    return workdir / "out", summary


@pytest.mark.slow
def test_a_few_rows_overfit_and_greedy_generation_reproduces_and_stops(workdir, trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, summary = trained
    losses = [loss for _, loss in summary["train_loss"]]
    assert losses[-1] < 0.1 < losses[0]
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workdir / "model"), out).eval()
    for row in ROWS:
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        generated = model.generate(**prompt, max_new_tokens=60, do_sample=False)[0, prompt["input_ids"].shape[1]:]
        assert generated[-1].item() == tokenizer.eos_token_id  # it stopped by itself
        assert tokenizer.decode(generated, skip_special_tokens=True) == row["messages"][-1]["content"]


def test_adapter_reload_and_merged_model_give_the_same_logits(workdir, trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, _ = trained
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workdir / "model"), out).eval()
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        base = AutoModelForCausalLM.from_pretrained(workdir / "model").eval()
        a, m, b = adapter(ids).logits, merged(ids).logits, base(ids).logits
    assert torch.allclose(a, m, atol=1e-4)
    assert not torch.allclose(a, b, atol=1e-2)  # the adapter did change the model
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 60


def test_unknown_yaml_key_is_a_one_line_error(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("model_name_or_path: x\nuse_cpu: true\nlora_rnk: 8\n")
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "lora_rnk" in err and len(err.splitlines()) == 1


def test_missing_config_file_is_a_one_line_error(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_a_model_neither_local_nor_reachable_fails_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    assert main(["--model_name_or_path", "some-org/not-downloaded-model", "--output_dir", str(tmp_path), "--use_cpu",
                 "--dataset_path", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a local directory" in err and len(err.splitlines()) == 1
    assert time.perf_counter() - start < 10


def test_a_dataset_mix_trains_on_both_datasets(workdir, tmp_path):
    """dataset_mix: concatenated without weights, drawn by weight (the small one repeated) with them."""
    real = tmp_path / "real" / "data"
    real.mkdir(parents=True)
    datasets.Dataset.from_list([fixit_row(i) for i in (10, 11)]).to_parquet(real / "train-00000-of-00001.parquet")

    def prompts(*extra: str) -> list[str]:
        trainer = build_trainer(*args_for(workdir, "mix", "--max_steps", "1", *extra))
        return [r["prompt"][1]["content"] for r in trainer.train_dataset]

    both = prompts("--dataset_mix", str(real.parent))
    assert sorted(both) == sorted(f"Write kernel number {i} for softmax." for i in (0, 1, 2, 10, 11))
    weighted = prompts("--dataset_mix", f"{real.parent}:3")
    assert set(weighted) == set(both) and len(weighted) > len(both)  # until both are seen whole


@pytest.mark.slow
def test_the_tiny_offline_config_trains_on_a_mix(tmp_path, capsys):
    real = tmp_path / "real" / "data"
    real.mkdir(parents=True)
    datasets.Dataset.from_list([fixit_row(i) for i in (10, 11)]).to_parquet(real / "train-00000-of-00001.parquet")
    assert main(["--config", str(ROOT / "configs" / "fixit-tiny.yaml"), "--model_name_or_path", str(tmp_path / "model"),
                 "--output_dir", str(tmp_path / "out"), "--dataset_mix", f"{real.parent}:0.5", "--max_steps", "2",
                 "--tiny_hidden_size", "32", "--tiny_num_layers", "1"]) == 0
    assert json.loads((tmp_path / "out" / "training_summary.json").read_text())["steps"] == 2
    assert main(["--config", str(ROOT / "configs" / "fixit-tiny.yaml"), "--dataset_mix", f"{real.parent}:-1",
                 "--output_dir", str(tmp_path / "bad")]) == 2
    assert "dataset weights must be positive" in capsys.readouterr().err
