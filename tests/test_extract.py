import pytest

from evaluator.extract import ExtractionError, extract_code

SOURCE = "import jax\n\ndef kernel(x):\n    return x\n"


def test_takes_the_last_python_block():
    answer = f"First try:\n```python\ndef kernel(x):\n    pass\n```\nFixed:\n```python\n{SOURCE}```\nDone."
    assert extract_code(answer) == SOURCE


def test_ignores_blocks_in_other_languages():
    answer = f"```python\n{SOURCE}```\nRun it with:\n```bash\npython run.py\n```"
    assert extract_code(answer) == SOURCE


def test_bare_source_file_is_taken_whole():
    assert extract_code(SOURCE) == SOURCE


@pytest.mark.parametrize("answer", [
    "I cannot help with that.",
    "```python\n```",
    "Here is the code:\n```python\ndef kernel(x):\n    return x\n",  # never closed (truncated)
    "```bash\nls\n```",
])
def test_no_usable_code_is_an_extraction_error(answer):
    with pytest.raises(ExtractionError):
        extract_code(answer)
