"""The entry points say what a config needs that this machine lacks (training/preflight.py): the
real recipes on this GPU-less, offline machine end in one line with the commands that run here,
and every config of the repository parses with deprecation warnings as errors."""
import shlex
import time
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_module

for _module in ("trl", "peft", "torch"):
    require_module(_module, "pip install -e '.[train]'")

import yaml

from training import rl, sft
from training.preflight import check_machine, missing_bf16_device

CONFIGS = [ROOT / "fixit.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]
ENTRY_POINTS = {"training.sft": sft, "training.rl": rl}

without_bf16_gpu = pytest.mark.skipif(missing_bf16_device() is None,
                                      reason="this machine trains in bf16: the GPU recipes are not refused here")


@pytest.fixture
def offline_at_root(monkeypatch):
    """As a user runs the commands: from the repository root, the hub unreachable."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)


def run_main(module, argv: list[str], capsys) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of an entry point's main."""
    start = time.perf_counter()
    code = module.main(argv)
    return code, capsys.readouterr().err.strip(), time.perf_counter() - start


def cpu_check_argv(err: str, module: str) -> list[str]:
    """The arguments of the CPU check the error line proposes."""
    command = err.split("to check this recipe on a CPU: ", 1)[1]
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", module], command
    return words[3:]


def assert_runs_here(module, argv: list[str]) -> None:
    """The proposed command passes the check, and TRL's config dataclasses accept it."""
    check_machine(module.make_parser(), argv, module.ENTRY)
    _, training_args, model_args = module.make_parser().parse_args_and_config(argv)
    assert training_args.use_cpu and not training_args.bf16 and training_args.max_steps == 1
    assert model_args.model_name_or_path.startswith("runs/")


def entry_of(config: Path):
    """The entry point module whose parser knows every key of `config` (exactly one must)."""
    keys = dict.fromkeys(yaml.safe_load(config.read_text()))
    knowing = [m for m in ENTRY_POINTS.values() if not m.make_parser().set_defaults_with_config(**keys)]
    assert len(knowing) == 1, f"{config.name}: keys known to {len(knowing)} entry points"
    return knowing[0]


@without_bf16_gpu
def test_the_sft_recipe_here_is_one_line_naming_what_is_missing_and_what_runs(offline_at_root, capsys):
    code, err, seconds = run_main(sft, ["--config", "fixit.yaml"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: fixit.yaml: bf16: true needs a GPU with bf16, and this machine has none")
    assert "model_name_or_path: model 'Qwen/Qwen2.5-Coder-7B-Instruct' is not a local directory" in err
    assert "To try the pipeline here: python -m training.sft --config configs/fixit-tiny.yaml;" in err
    argv = cpu_check_argv(err, "training.sft")
    assert argv[:2] == ["--config", "fixit.yaml"] and "--use_cpu true --bf16 false" in shlex.join(argv)
    assert_runs_here(sft, argv)
    assert seconds < 30  # no hub retries (a minute), no trainer built: about 5 s here


@without_bf16_gpu
def test_the_rl_recipe_here_is_one_line_naming_what_is_missing_and_what_runs(offline_at_root, capsys):
    code, err, seconds = run_main(rl, ["--config", "configs/grpo.yaml"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: configs/grpo.yaml: bf16: true needs a GPU with bf16")
    assert "use_vllm: true needs vLLM on a CUDA GPU" in err and "model_name_or_path: " in err
    assert "To try the pipeline here: python -m training.rl --config configs/grpo-tiny.yaml;" in err
    argv = cpu_check_argv(err, "training.rl")
    joined = shlex.join(argv)
    assert "--use_cpu true --bf16 false --use_vllm false" in joined and "--max_steps 1" in joined
    assert_runs_here(rl, argv)
    assert seconds < 30  # no hub retries (a minute), no trainer built: about 5 s here


@without_bf16_gpu
def test_a_config_naming_only_a_model_is_told_that_trl_trains_in_bf16(tmp_path, offline_at_root, capsys):
    config = tmp_path / "minimal.yaml"
    config.write_text(f"model_name_or_path: {tmp_path}\n")
    code, err, _ = run_main(rl, ["--config", str(config)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{config}: bf16 (not set: TRL's default is true) needs a GPU with bf16" in err
    assert "model_name_or_path" not in err  # the model is there: only what is missing is named
    assert "--use_cpu true --bf16 false --max_steps 1" in err


def test_a_missing_dataset_is_named_before_a_tiny_model_is_built(tmp_path, offline_at_root, capsys):
    model = tmp_path / "model"
    code, err, _ = run_main(sft, ["--config", "configs/fixit-tiny.yaml", "--model_name_or_path", str(model),
                                  "--dataset_path", str(tmp_path / "nowhere"), "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"dataset_path: {tmp_path / 'nowhere'} does not exist (build it with python -m data_gen.collect)" in err
    assert not model.exists()


def test_an_unknown_key_is_named_before_what_the_machine_lacks(tmp_path, offline_at_root, capsys):
    """TrlParser reports unknown keys only after TRL's own bf16 check: the old recipe's warmup_ratio hid behind it."""
    config = tmp_path / "old.yaml"
    config.write_text("model_name_or_path: x\nbf16: true\nwarmup_ratio: 0.05\n")
    code, err, _ = run_main(sft, ["--config", str(config)], capsys)
    assert code == 2
    assert err == f"error: {config}: unknown config keys: warmup_ratio (the keys: python -m training.sft --help)"


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.stem.endswith("-tiny")], ids=lambda c: c.name)
def test_the_tiny_configs_pass_the_check(config, offline_at_root):
    module = entry_of(config)
    check_machine(module.make_parser(), ["--config", str(config)], module.ENTRY)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_every_config_parses_without_deprecation_warnings(config):
    """Every key is known to the installed transformers and TRL under its current name (use_cpu only
    lets the GPU recipes parse here; it leaves their keys as they are)."""
    module = entry_of(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        module.make_parser().parse_args_and_config(["--config", str(config), "--use_cpu", "true"])

