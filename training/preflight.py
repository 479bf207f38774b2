"""What a training config needs from this machine, checked before TRL builds anything.

`training.sft` and `training.rl` parse their configs with `parse_checked`. Before TrlParser builds
the TRL config dataclass (whose own check, in `TrainingArguments.__post_init__`, ends a GPU recipe
on a CPU machine with "Your setup doesn't support bf16/gpu"), the raw YAML and command-line values
are read with the same parser and checked against the machine: bf16 or vLLM without a GPU, model
weights that are neither local nor reachable, dataset folders that do not exist. Whatever is
missing is one line naming each config key and what the machine lacks, then the commands that
work here: the entry point's tiny offline config, and the same config run small on a CPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelNotAvailable(RuntimeError):
    """The model is neither a local directory nor cached nor reachable: fail before any work."""


class MachineLacks(ValueError):
    """The config needs what this machine does not have: a usage error (one line, exit 2)."""


def require_model(name: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, if `name` cannot be loaded (the hub's own retries take a minute)."""
    if Path(name).is_dir():
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotAvailable(f"model directory {name} does not exist")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelNotAvailable(f"model {name!r} is not a local directory and not in the Hugging Face cache, "
                                "and HF_HUB_OFFLINE is set: download it first or pass a local directory")
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(name, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot load it from here
        reason = " ".join(str(exc).split())[:200]
        raise ModelNotAvailable(f"model {name!r} is not local and the Hugging Face Hub cannot serve it "
                                f"({type(exc).__name__}: {reason})") from None


@dataclass(frozen=True)
class Problem:
    """One thing the config needs and the machine lacks; `cpu_flags` work around it for a CPU check
    (none: no flag helps, e.g. a dataset that has to be built first)."""

    text: str
    cpu_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class EntryPoint:
    """What the check needs to know of an entry point: its module, its tiny offline config, the
    dataset folders a config reads, and the flags that make a run small enough to check a config."""

    module: str
    tiny_config: str
    folders: Callable[[argparse.Namespace], list[tuple[str, str]]] = lambda values: []
    small_run: Callable[[argparse.Namespace], list[str]] = lambda values: ["--max_steps", "1"]

    @property
    def cpu_check_model(self) -> str:
        """Where a CPU check builds its tiny model: one per entry point, each tokenizer trained on its own texts."""
        return f"runs/{self.module.rpartition('.')[2]}-cpu-check-model"


def missing_bf16_device() -> str | None:
    """Why bf16 training without use_cpu cannot run here (transformers' own test), or None."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_cuda_available, is_torch_xla_available

    if is_torch_bf16_gpu_available() or is_torch_xla_available():
        return None
    return "this machine's GPU has no bf16 (Ampere or newer)" if is_torch_cuda_available() else \
        "this machine has none (no CUDA device)"


def missing_vllm() -> str | None:
    """Why TRL's vLLM generation cannot run here (it needs vllm and a CUDA device), or None."""
    from transformers.utils import is_torch_cuda_available

    lacks = [reason for reason, absent in (("no CUDA device", not is_torch_cuda_available()),
                                           ("vllm is not installed", importlib.util.find_spec("vllm") is None))
             if absent]
    return " and ".join(lacks) or None


def bf16_setting(values: argparse.Namespace) -> str | None:
    """The setting that asks for bf16, as the message names it (TRL's bf16 is true unless set or
    fp16 is on), or None."""
    bf16 = getattr(values, "bf16", False)
    if bf16 is None and not getattr(values, "fp16", False):
        return "bf16 (not set: TRL's default is true)"
    if bf16:
        return "bf16: true"
    return "bf16_full_eval: true" if getattr(values, "bf16_full_eval", False) else None


def precision_problems(values: argparse.Namespace) -> list[Problem]:
    """bf16 without use_cpu on a machine with no bf16 GPU: transformers' "Your setup doesn't support bf16/gpu"."""
    setting = None if getattr(values, "use_cpu", False) else bf16_setting(values)
    lack = missing_bf16_device() if setting else None
    return [Problem(f"{setting} needs a GPU with bf16, and {lack}", ("--use_cpu", "true", "--bf16", "false"))] \
        if lack else []


def vllm_problems(values: argparse.Namespace) -> list[Problem]:
    """use_vllm on a machine where vLLM cannot run."""
    lack = missing_vllm() if getattr(values, "use_vllm", False) else None
    return [Problem(f"use_vllm: true needs vLLM on a CUDA GPU, and this machine has {lack}",
                    ("--use_vllm", "false"))] if lack else []


def model_problems(entry: EntryPoint, values: argparse.Namespace) -> list[Problem]:
    """Model weights neither local nor cached nor reachable (a smoke run's tiny model is built instead);
    a CPU check uses a tiny model, built offline on first use, in place of the recipe's."""
    name = getattr(values, "model_name_or_path", None)
    if not name or getattr(values, "build_tiny_model", False):
        return []  # no model at all is the entry point's own one-line error
    try:
        require_model(name)
    except ModelNotAvailable as exc:
        return [Problem(f"model_name_or_path: {exc}",
                        ("--model_name_or_path", entry.cpu_check_model, "--build_tiny_model", "true"))]
    return []


def folder_problems(entry: EntryPoint, values: argparse.Namespace) -> list[Problem]:
    """Dataset folders the config reads that do not exist."""
    return [Problem(f"{key}: {folder} does not exist (build it with python -m data_gen.collect)")
            for key, folder in entry.folders(values) if not Path(folder).is_dir()]


def problems(entry: EntryPoint, values: argparse.Namespace) -> list[Problem]:
    """Everything the config needs and this machine lacks, cheapest checks first."""
    return (precision_problems(values) + vllm_problems(values) + folder_problems(entry, values)
            + model_problems(entry, values))


def message(entry: EntryPoint, config: str | None, argv: Sequence[str], values: argparse.Namespace,
            found: list[Problem]) -> str:
    """The one line: what is missing, then the commands that run here."""
    where = f"{config}: " if config else ""
    lacks = "; ".join(p.text for p in found)
    flags = [flag for p in found for flag in p.cpu_flags]
    if not flags:
        return where + lacks
    hints = []
    if config is None or Path(config).resolve() != Path(entry.tiny_config).resolve():
        hints.append(f"try the pipeline here: python -m {entry.module} --config {entry.tiny_config}")
    check = ["python", "-m", entry.module, *argv, *flags, *entry.small_run(values)]
    hints.append(f"check this recipe on a CPU: {shlex.join(check)}")
    return f"{where}{lacks}. To {'; to '.join(hints)}"


def raw_values(parser: Any, argv: list[str]) -> tuple[str | None, argparse.Namespace]:
    """(config path, the YAML and command-line values as argparse reads them) without building the
    dataclasses. An unknown key or flag is refused here: TrlParser reports those only after the
    dataclasses are built, so their own checks would speak first."""
    import yaml

    args = list(argv)
    config_path = None
    if "--config" in args:
        at = args.index("--config")
        if at + 1 == len(args):
            raise ValueError("--config needs the path of a YAML file")
        config_path = args[at + 1]
        del args[at:at + 2]
    config: Any = {}
    if config_path is not None:
        with open(config_path) as f:
            config = yaml.safe_load(f)
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} must hold a YAML mapping of config keys")
        config = dict(config)
        for key, value in (config.pop("env", None) or {}).items():  # as TrlParser does: it may set HF_HUB_OFFLINE
            os.environ[key] = str(value)
    unknown_keys = parser.set_defaults_with_config(**config)[::2]
    if unknown_keys:
        names = ", ".join(k.removeprefix("--") for k in unknown_keys)
        raise ValueError(f"{config_path}: unknown config keys: {names} (the keys: {parser.prog} --help)")
    values, unknown_flags = parser.parse_known_args(args)
    if unknown_flags:
        raise ValueError(f"unknown arguments: {' '.join(unknown_flags)} (the flags: {parser.prog} --help)")
    return config_path, values


def check_machine(parser: Any, argv: Sequence[str] | None, entry: EntryPoint) -> None:
    """Raise MachineLacks (one line) when the config needs what this machine does not have."""
    args = list(sys.argv[1:] if argv is None else argv)
    config, values = raw_values(parser, args)
    found = problems(entry, values)
    if found:
        raise MachineLacks(message(entry, config, args, values, found))


def parse_checked(parser: Any, argv: Sequence[str] | None, entry: EntryPoint) -> tuple[Any, ...]:
    """TrlParser.parse_args_and_config, after the machine check."""
    check_machine(parser, argv, entry)
    return parser.parse_args_and_config(None if argv is None else list(argv))
