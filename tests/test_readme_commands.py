"""The README's two commands are what CI runs: .ci/run reads them from the README itself."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CI_RUN = ROOT / ".ci" / "run"


def _readme_commands_module():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_commands_are_found_in_the_readme() -> None:
    commands = _readme_commands_module().readme_commands((ROOT / "README.md").read_text())
    assert set(commands) == {"main", "test"}
    for command in commands.values():
        # Plain commands a user without root can paste: a venv, pip, then the job.
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e ")
        assert "sudo" not in command and "apt" not in command
    assert commands["test"].endswith("&& pytest")
    assert commands["main"].endswith("&& python -m data_gen.collect")


def test_ci_runs_what_the_script_prints_and_nothing_in_its_place() -> None:
    """CI must execute the extracted commands, not its own copy of them."""
    script = CI_RUN.read_text()
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(code)
    assert "python3 .ci/readme_commands.py main" in text
    assert "python3 .ci/readme_commands.py test" in text
    assert re.search(r'bash -euo pipefail -c "\$test_cmd"', text)
    assert re.search(r'bash -euo pipefail -c "\$main_cmd"', text)
    # No paraphrase: CI may install its own prerequisites, but never the project itself.
    assert "pip install -e" not in text and "pip install -q -e" not in text
    assert not re.search(r"^\s*(python -m )?pytest\s*$", text, re.M)
    assert "check_dataset.py" in text


def test_the_script_prints_each_command(tmp_path) -> None:
    for name in ("main", "test"):
        out = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), name],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out in (ROOT / "README.md").read_text()


def test_a_readme_without_the_labelled_command_is_an_error() -> None:
    module = _readme_commands_module()
    text = (ROOT / "README.md").read_text().replace("# set up and run the tests", "# run tests")
    with pytest.raises(ValueError, match="set up and run the tests"):
        module.readme_commands(text)
    with pytest.raises(ValueError, match="no ```bash block"):
        module.readme_commands("# a README with no commands\n")
