"""Peer suites (suites/): a JAXBench checkout's workloads and KernelBench-JAX problems as tasks.

The fixture checkout (tests/peer_suites/jaxbench) is written here in their formats, hard cases
included: shapes hard-coded in create_inputs, all-zero weights, weights held as Model attributes,
an optimized.py carrying its benchmark harness and a helper from jax.experimental.pallas.ops,
a create_inputs returning a Python int, a Model whose weights are None until set from PyTorch.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from evaluator.truth.compare import compare
from suites import LoadError, listing, open_suite
from suites.jaxbench import IMPORTED_WORK_SLACK
from suites.report import check_suite, summary
from suites.sizes import count_names, divide_counts, heldout_variants, power_of_two_floor, scaled
from suites.source import SizeEdit, rewrite_sizes, strip_harness
from tests.conftest import PEER_FIXTURE

FIXTURE = PEER_FIXTURE
GEMM = "jaxbench/8p_GEMM"
ZERO_WEIGHTS = "jaxbench/19k_Matmul_Subtract_Multiply_ReLU"
KB_ZERO_WEIGHTS = "kernelbench-jax/level2/12_Gemm_Multiply_LeakyReLU"
LOADABLE = [GEMM, "jaxbench/12p_RMSNorm", ZERO_WEIGHTS, "kernelbench-jax/level1/23_Softmax", KB_ZERO_WEIGHTS]
NOT_LOADABLE = {"jaxbench/11p_Static_Group_Size": "Python int",
                "kernelbench-jax/level1/50_Conv2D_Weights_From_Torch": "NoneType"}

# KernelBench style: ModelNew built like Model, its weights set by the grader, a Pallas forward.
MODEL_NEW = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 512


class ModelNew:
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros(out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        (m, k), n = x.shape, self.weight.shape[1]
        mult, slope = self.multiplier, self.negative_slope

        def body(x_ref, w_ref, b_ref, o_ref, acc_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

            acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

            @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
            def _():
                y = (acc_ref[...] + b_ref[...]) * mult
                o_ref[...] = jnp.where(y >= 0, y, y * slope).astype(o_ref.dtype)

        return pl.pallas_call(
            body, grid=(m // BLOCK, n // BLOCK, k // BLOCK),
            in_specs=[pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (kk, j)),
                      pl.BlockSpec((1, BLOCK), lambda i, j, kk: (0, j))],
            out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            scratch_shapes=[pltpu.VMEM((BLOCK, BLOCK), jnp.float32)],
        )(x, self.weight, self.bias.reshape(1, n))
'''


# --- text only: names, sizes, harness ------------------------------------------------------------
def test_entries_are_named_after_their_folders_and_files(suite):
    assert sorted(suite.names()) == sorted([*LOADABLE, *NOT_LOADABLE])  # level1/__init__.py is no problem


def test_check_sizes_keep_the_power_of_two_a_tuned_kernel_divides():
    assert power_of_two_floor(28672) == 2048 and power_of_two_floor(4096) == 2048
    assert power_of_two_floor(96) == 32 and power_of_two_floor(1000) == 8
    assert [scaled(v, 2048) for v in (8192, 28672, 6144, 96)] == [2048, 2048, 2048, 32]
    assert scaled(8192, 256) == 256  # a cap below the floor, when interpret mode needs it
    assert scaled(8, 16) == 8  # counts below MIN_SIZE keep their value


def test_heldout_sizes_differ_in_kind():
    check = {"batch": 4, "seq_len": 128, "heads": 64}
    original = {"batch": 4, "seq_len": 4096, "heads": 64}
    variants = dict(heldout_variants(check, original))
    assert variants["batch 1, ragged"] == {"batch": 1, "seq_len": 168, "heads": 64}
    assert variants["batch 1"]["batch"] == 1 and variants["ragged"]["seq_len"] % 32
    # two sizes that share an original value cannot change alone (a hard-coded literal maps to one value)
    shared = dict(heldout_variants({"in": 2048, "out": 2048, "b": 2048}, {"in": 8192, "out": 8192, "b": 4096}))
    assert all(v["in"] == v["out"] for v in shared.values())


def test_the_harness_goes_and_only_what_it_alone_imports():
    text = (FIXTURE / "benchmark/8p_GEMM/optimized.py").read_text()
    stripped = strip_harness(text)
    assert "def benchmark" not in stripped.source and "__main__" not in stripped.source
    assert "\nimport time\n" not in stripped.source
    assert "import functools" in stripped.source and "def get_flops" in stripped.source
    assert stripped.removed == ["the benchmark() function", "the `if __name__ == '__main__':` block",
                                "import of time (used only by the harness)"]
    compile(stripped.source, "optimized.py", "exec")


def test_hard_coded_shapes_are_rewritten_by_value():
    text = (FIXTURE / "benchmark/19k_Matmul_Subtract_Multiply_ReLU/baseline.py").read_text()
    new = rewrite_sizes(text, SizeEdit(config={"batch_size": 64}, literals={4096: 64, 8192: 32},
                                       literal_scopes=frozenset({"create_inputs"})))
    assert "(64, 32)" in new and "'batch_size': 64" in new
    assert "x - 2.0" in new  # floats and other functions untouched


# --- loading: their code in the sandbox ----------------------------------------------------------
@pytest.mark.parametrize("name", LOADABLE)
def test_loadable_entries_become_tasks(suite, name):
    task = suite.task(name)
    loaded = suite.loaded[name]
    assert task.tpu == "v6e" and task.work_slack == IMPORTED_WORK_SLACK  # it does not say what may be skipped
    check = task.select("train", "check")[0]
    heldout = task.select("heldout", "check")[0]
    assert heldout.dims != check.dims
    bench = task.select("train", "bench")[0]
    counts = count_names(bench.dims, by_value=loaded.hard_coded)
    for key, size in bench.dims.items():  # the power-of-two rule, under the cap it needed
        if key in counts:
            assert check.dims[key] == size // math.gcd(size, loaded.counts_divided_by)
        elif size >= 16:
            assert check.dims[key] % min(power_of_two_floor(size), loaded.cap) == 0
    assert task.reference_text is not None and "def benchmark" not in task.reference_text


def test_gemm_check_sizes_take_the_tuned_blocks(suite):
    check = suite.task(GEMM).select("train", "check")[0]
    assert check.dims == {"M": 2048, "K": 2048, "N": 2048}
    assert suite.loaded[GEMM].cap == 2048


def test_counts_shrink_before_the_extents_a_block_divides(suite):
    """RMSNorm over 8 x 4096 x 8192 exceeds interpret mode's budget at the full rule (2048-wide
    extents): the batch is divided, the extents keep their tuned power of two."""
    check = suite.task("jaxbench/12p_RMSNorm").select("train", "check")[0]
    assert check.dims == {"batch": 2, "seq_len": 2048, "emb_dim": 2048}
    assert suite.loaded["jaxbench/12p_RMSNorm"].cap == 2048
    assert suite.loaded["jaxbench/12p_RMSNorm"].counts_divided_by == 4
    # counts keep their ratio (query heads per kv head) until the smaller one reaches 1
    gqa = {"num_query_heads": 128, "num_kv_heads": 8, "seq_len": 2048, "head_dim": 128}
    names = count_names(gqa, by_value=False)
    assert names == ["num_query_heads", "num_kv_heads"]
    assert divide_counts(gqa, names, 8) == {**gqa, "num_query_heads": 16, "num_kv_heads": 1}
    assert divide_counts(gqa, names, 16) == {**gqa, "num_query_heads": 8, "num_kv_heads": 1}
    # a file rewritten by value cannot change a count that shares its value with an extent
    assert count_names({"heads": 128, "head_dim": 128, "batch": 4}, by_value=True) == ["batch"]
    # KernelBench's GEMMs name their M `batch_size`: an extent a tuned block spans
    assert count_names({"batch_size": 4096, "in_features": 8192}, by_value=False) == []


@pytest.mark.parametrize("name,why", sorted(NOT_LOADABLE.items()))
def test_entries_that_cannot_load_say_why(suite, name, why):
    with pytest.raises(LoadError, match=why):
        suite.task(name)


@pytest.mark.parametrize("name,weights", [(ZERO_WEIGHTS, ["bias", "weight"]),
                                          (KB_ZERO_WEIGHTS, ["self.bias", "self.weight"])])
def test_zero_weights_are_redrawn_and_a_zeros_output_then_fails(suite, name, weights):
    task = suite.task(name)
    assert suite.loaded[name].repaired == weights
    case = task.select("train", "check")[0]
    inputs, outputs = task.external.sample(case, seed=3)
    assert np.ptp(outputs[0]) > 0
    tolerance = task.tolerances[case.dtype]
    assert not compare(np.zeros_like(outputs[0]), outputs[0], tolerance).ok
    # the file's own zero weights: the reference is constant, which is what let zeros pass
    names = task.external.described[case.name].names
    raw = [np.zeros_like(a) if name in weights else a for name, a in zip(names, inputs)]
    constant = task.external.outputs(case, raw)[0]
    assert np.all(constant == constant.reshape(-1)[0])


def test_seeds_draw_other_inputs_from_their_maker(suite):
    task = suite.task(GEMM)
    case = task.select("train", "check")[0]
    a, _ = task.external.sample(case, 1)
    b, _ = task.external.sample(case, 2)
    assert not np.array_equal(a[0], b[0])


def _one_workload(root: Path, name: str, n: int, body: str) -> None:
    """A checkout of one priority workload of `n` random floats: `workload(x)` returns `body`."""
    (root / "benchmark" / name).mkdir(parents=True)
    (root / "benchmark" / name / "baseline.py").write_text(
        f"import os\nimport jax\nimport jax.numpy as jnp\n\nCONFIG = {{'name': 'w', 'n': {n}}}\n\n\n"
        "def create_inputs(dtype=jnp.float32):\n"
        "    return (jax.random.normal(jax.random.key(1), (CONFIG['n'],), dtype),)\n\n\n"
        f"def workload(x):\n    return {body}\n")


def test_their_code_runs_in_a_sandboxed_worker_not_here(tmp_path):
    _one_workload(tmp_path, "1p_Pid", 256, "x * 0 + os.getpid() + jnp.arange(x.shape[0])")
    with open_suite(f"jaxbench:{tmp_path}") as s:
        task = s.task("jaxbench/1p_Pid")
        _, outputs = task.external.sample(task.select("train", "check")[0], 0)
        pid = int(outputs[0][0])
        assert pid != os.getpid()
        assert os.getpgid(pid) == pid  # the worker leads its own process group (evaluator/execution/sandbox.py)
    assert not any(getattr(m, "__file__", "") and str(tmp_path) in str(m.__file__) for m in list(sys.modules.values()))


def test_a_build_for_the_static_stages_runs_nothing_and_keeps_no_record(tmp_path, monkeypatch):
    """`estimate` builds tasks without running their reference (suites.jaxbench.load): one whose
    output is constant, refused when run, is still a task there, and the load cache that listings
    read keeps only what a whole build found."""
    monkeypatch.setenv(listing.CACHE_ENV, str(tmp_path / "loads"))
    _one_workload(tmp_path, "1p_Zero", 1024, "x * 0.0")
    name = "jaxbench/1p_Zero"
    with open_suite(f"jaxbench:{tmp_path}") as s:
        task = s.task(name, run_reference=False)
        assert [c.dims for c in task.select("train", "bench")] == [{"n": 1024}]
        assert listing.lookup(s.entries[name]) is None
        with pytest.raises(LoadError, match="constant"):
            s.task(name)
        record = listing.lookup(s.entries[name])
        assert not record.loaded and record.refused_when_run
    with open_suite(f"jaxbench:{tmp_path}") as s:  # a new process: the record says why, and only a run refuses it
        assert s.task(name, run_reference=False).name == name
        with pytest.raises(LoadError, match="constant"):
            s.task(name)

# --- grading: their files and ours -----------------------------------------------------------------
def test_optimized_py_is_graded_correct_without_edits(suite, v6e):
    task = suite.task(GEMM)
    verdict = v6e.grade(task, suite.entry(GEMM).optimized.read_text(), seed=0)
    assert verdict.status == "correct", verdict.message
    assert verdict.details["tpu_generation"] == "v6e"
    assert "import of time (used only by the harness)" in ", ".join(verdict.details["adapted"])


def test_a_model_new_gets_the_reference_weights(suite, v6e):
    verdict = v6e.grade(suite.task(KB_ZERO_WEIGHTS), MODEL_NEW, seed=0)
    assert verdict.status == "correct", verdict.message
    assert verdict.details["adapted"] == ["added kernel(), which builds your ModelNew and sets the "
                                          "reference's weights on it (in your layout where it differs "
                                          "only by axes of size 1)"]


def test_a_candidate_without_the_entry_point_is_told_which(suite, v6e):
    verdict = v6e.grade(suite.task(GEMM), "```python\ndef gemm(a, b):\n    return a @ b\n```", seed=0)
    assert verdict.status == "import_error" and "`workload`" in verdict.message


def test_the_suite_report(suite, v6e):
    rows = check_suite(suite, v6e, seed=0)
    by_name = {r.name: r for r in rows}
    totals = summary(rows)
    assert totals["groups"]["jaxbench"] == {"entries": 4, "loaded": 3}
    assert totals["groups"]["kernelbench-jax/level1"] == {"entries": 2, "loaded": 1}
    assert totals["baselines_no_kernel"] == totals["loaded"] == 5
    assert totals["zeros_refused"] == 5
    assert by_name[GEMM].optimized == "correct"
    assert by_name[ZERO_WEIGHTS].repaired == ["bias", "weight"]
    assert "Python int" in by_name["jaxbench/11p_Static_Group_Size"].why_not


FAKED_WORK = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

B = 512


def _body(x_ref, w_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = (acc_ref[...] * 0.0).astype(o_ref.dtype)


def workload(x, weight, bias):
    m, k = x.shape
    n = weight.shape[1]
    return pl.pallas_call(
        _body, grid=(m // B, n // B, k // B),
        in_specs=[pl.BlockSpec((B, B), lambda i, j, kk: (i, kk)), pl.BlockSpec((B, B), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((B, B), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((B, B), jnp.float32)],
    )(x, weight)
"""


def test_a_zeros_kernel_doing_the_work_still_fails_on_values(suite, v6e):
    """Zeros from a kernel that does the matmul (so no static rule refuses it) fail on the redrawn
    weights: on the file's own zero weights they would have been the reference's answer."""
    verdict = v6e.grade(suite.task(ZERO_WEIGHTS), FAKED_WORK, seed=0)
    assert verdict.status == "wrong_output", verdict.message


# --- prompts and the command line ----------------------------------------------------------------
def test_the_prompt_asks_for_their_entry_point(suite):
    from chat.prompts import task_prompt

    prompt = task_prompt(suite.task(GEMM))
    assert "defines `workload`" in prompt and "your `workload` must match it" in prompt
    assert "def create_inputs" in prompt and "def benchmark" not in prompt
    model_prompt = task_prompt(suite.task(KB_ZERO_WEIGHTS))
    assert "defines `ModelNew`" in model_prompt and "class Model" in model_prompt


@pytest.mark.slow
def test_cli_lists_runs_and_refuses_bad_suites(cli, tmp_path):
    listed = cli("tasks", "--suite", f"jaxbench:{FIXTURE}", "--load", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(t["name"] for t in json.loads(listed.stdout) if t["status"] == "loaded") == sorted(LOADABLE)
    assert "not loaded: jaxbench/11p_Static_Group_Size" in listed.stderr
    candidate = tmp_path / "optimized.py"
    shutil.copy(FIXTURE / "benchmark/8p_GEMM/optimized.py", candidate)
    ran = cli("run", "--suite", f"jaxbench:{FIXTURE}", "--task", GEMM, "--candidate", str(candidate),
               "--seed", "0", "--json")
    assert ran.returncode == 0, ran.stderr
    verdict = json.loads(ran.stdout)
    assert verdict["status"] == "correct" and verdict["details"]["tpu_generation"] == "v6e"
    for bad, message in ((f"jaxbench:{tmp_path}/nowhere", "suite folder not found"),
                         (f"kernelbench:{FIXTURE}", "KIND:PATH"), (f"jaxbench:{tmp_path}", "not a JAXBench checkout")):
        out = cli("tasks", "--suite", bad)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    missing = cli("run", "--suite", f"jaxbench:{FIXTURE}", "--task", "jaxbench/11p_Static_Group_Size",
                   "--candidate", str(candidate))
    assert missing.returncode == 2 and "cannot load jaxbench/11p_Static_Group_Size" in missing.stderr


# --- a real checkout, when one is at hand (JAXBENCH=/path/to/JAXBench) ------------------------------
REAL = Path(os.environ.get("JAXBENCH", "/nonexistent"))


@pytest.mark.slow
@pytest.mark.skipif(not (REAL / "benchmark").is_dir(), reason="set JAXBENCH to a JAXBench clone")
def test_a_real_checkout_loads(cli):
    out = cli("check-suite", f"jaxbench:{REAL}", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    totals = json.loads(out.stdout)["summary"]
    groups = totals["groups"]
    assert groups["jaxbench"]["loaded"] >= 45
    for level in ("kernelbench-jax/level1", "kernelbench-jax/level2"):
        assert groups[level]["loaded"] >= 0.9 * groups[level]["entries"]
    assert totals["baselines_no_kernel"] == totals["loaded"] == totals["zeros_refused"]
    rows = {r["name"]: r for r in json.loads(out.stdout)["rows"]}
    # their tuned GEMM, and their flash attention once its heads shrink instead of its positions
    assert rows["jaxbench/8p_GEMM"]["optimized"] == rows["jaxbench/1p_Flash_Attention"]["optimized"] == "correct"


@pytest.mark.slow
def test_rebench_runs_an_imported_task(tmp_path):
    """training.rebench --suite: the model reads their file as the reference and answers in
    their format; the run defaults to v6e."""
    from tests.fake_openai_server import FakeOpenAIServer
    from training.rebench import main as rebench

    optimized = (FIXTURE / "benchmark/8p_GEMM/optimized.py").read_text()
    prompts = []

    def respond(messages, model):
        prompts.append(messages[1]["content"])
        return f"Tiled GEMM.\n```python\n{optimized}\n```"

    with FakeOpenAIServer(respond, models=("m",)) as server:
        code = rebench(["--suite", f"jaxbench:{FIXTURE}", "--task", GEMM, "--model", f"m=m@{server.base_url}",
                        "--samples", "1", "--workers", "1", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["tpu_generation"] == "v6e"
    assert report["results"]["m"]["train"]["tasks"][GEMM]["turns"][0]["pass@1"] == 1.0
    assert "defines `workload`" in prompts[0] and "def create_inputs" in prompts[0]
