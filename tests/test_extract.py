import pytest

from evaluator.candidate.extract import ExtractionError, extract_code

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


# A real module: its docstring shows usage in a fenced block, as recurrentgemma's pallas.py does.
DOCUMENTED_MODULE = '''"""Row softmax as a Pallas kernel.

Usage:

```python
y = kernel(x)
assert y.shape == x.shape
```
"""
import jax


def kernel(x):
    """Softmax over the last axis; see the example above."""
    return jax.nn.softmax(x)
'''


def test_a_python_file_is_graded_whole_whatever_its_docstrings_contain():
    assert extract_code(DOCUMENTED_MODULE) == DOCUMENTED_MODULE


@pytest.mark.parametrize("entry_point,definition", [
    ("workload", "def workload(x):\n    return x\n"),
    ("ModelNew", "class ModelNew:\n    def __call__(self, x):\n        return x\n"),
    ("kernel", "kernel = jax.jit(lambda x: x)\n"),
    ("kernel", "if True:\n    def kernel(x):\n        return x\n"),
])
def test_the_entry_point_may_be_any_module_level_binding(entry_point, definition):
    """A peer suite's entry point, an assignment, a def under a module-level if."""
    source = f'"""Example:\n\n```python\n{entry_point}(x)\n```\n"""\nimport jax\n\n{definition}'
    assert extract_code(source, entry_point) == source


def test_a_model_answer_still_gives_its_last_fenced_block():
    answer = f"The kernel tiles rows:\n\n```python\n{SOURCE}```\n\nCall it as `kernel(x)`."
    assert extract_code(answer) == SOURCE


@pytest.mark.parametrize("source", [
    "import jax\n\ndef make():\n    def kernel(x):\n        return x\n    return kernel\n",
    "import jax\n\nclass Ops:\n    def kernel(self, x):\n        return x\n",
])
def test_a_nested_kernel_is_not_the_entry_point(source):
    """Only a module-level definition is kernel(); one inside a function or a class is not."""
    with pytest.raises(ExtractionError, match="top level"):
        extract_code(source)


def test_a_truncated_file_is_taken_whole_so_its_syntax_is_reported():
    truncated = "import jax\n\ndef kernel(x:\n    return x\n"
    assert extract_code(truncated) == truncated
