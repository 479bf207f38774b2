"""The README's two contract commands, read from the README itself so CI never paraphrases them.

The README's first ```bash block holds them, each on the line after a comment that names it:
  # set up and run the main job ...   -> "main"
  # set up and run the tests ...      -> "test"

    python3 .ci/readme_commands.py test    # prints the test command
    python3 .ci/readme_commands.py main    # prints the main command

Standard library only: CI calls this before any virtual environment exists.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
# The comment that introduces each command, and the name CI asks for it by.
LABELS = {"main": "# set up and run the main job", "test": "# set up and run the tests"}


def readme_commands(text: str) -> dict[str, str]:
    """{"main": command, "test": command} from the README's first bash block."""
    block = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    if block is None:
        raise ValueError("the README has no ```bash block")
    lines = block.group(1).splitlines()
    found: dict[str, str] = {}
    for name, label in LABELS.items():
        for i, line in enumerate(lines):
            if line.strip().startswith(label) and i + 1 < len(lines) and lines[i + 1].strip():
                found[name] = lines[i + 1].strip()
                break
        else:
            raise ValueError(f"the README's first bash block has no command after {label!r}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in LABELS:
        print(f"usage: readme_commands.py {'|'.join(LABELS)}", file=sys.stderr)
        return 2
    try:
        print(readme_commands(README.read_text())[argv[0]])
    except ValueError as exc:
        print(f"readme_commands.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
