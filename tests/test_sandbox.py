"""The worker sandbox on its own: crashes, hangs, children, environment, temp dir, reuse.

These drive evaluator.execution.sandbox.Worker directly (no policy stage), the way a candidate that
slipped past the static checks would.
"""
import os
import re
import subprocess
import time

import pytest

from evaluator.execution.backends import get_backend
from evaluator.execution.protocol import CaseSpec, Done, Failed, Load, Lower, Ping, Pong, Reset, Trace, Traced
from evaluator.execution.sandbox import Limits, Worker, WorkerError, WorkerPool, worker_environment


@pytest.fixture()
def worker():
    w = Worker(get_backend("tpu-interpret"), Limits(step_timeout_s=5, memory_gb=4))
    yield w
    w.kill()


def load(worker, source, device_kind=None):
    return worker.call(Load(source, device_kind))[0]


def test_worker_is_reused_between_requests(worker):
    assert isinstance(load(worker, "def kernel(x):\n    return x\n"), Done)
    pid = worker.proc.pid
    worker.call(Reset())
    assert isinstance(load(worker, "def kernel(x):\n    return x\n"), Done)
    assert worker.proc.pid == pid


def test_hard_exit_becomes_a_crash_and_the_next_call_gets_a_fresh_worker(worker):
    with pytest.raises(WorkerError) as info:
        load(worker, "import os\nos._exit(3)\n")
    assert info.value.kind == "crash" and "code 3" in str(info.value)
    assert isinstance(load(worker, "def kernel(x):\n    return x\n"), Done)


def test_signal_death_is_reported(worker):
    with pytest.raises(WorkerError, match="SIGKILL"):
        load(worker, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")


def test_hang_is_killed_with_its_children(worker):
    marker = "987654.321"
    source = ("import subprocess\n"
              f"subprocess.Popen(['sleep', '{marker}'])\n"
              "while True:\n    pass\n")
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        load(worker, source)
    assert info.value.kind == "timeout"
    assert time.monotonic() - start < 15
    time.sleep(0.5)
    survivors = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert survivors.stdout.strip() == ""


def test_memory_limit_is_enforced(worker):
    reply = load(worker, "import numpy as np\nbig = np.ones(8 << 30, dtype=np.uint8)\n")
    assert isinstance(reply, Failed) and reply.error_type == "MemoryError"


def test_candidate_exceptions_and_system_exit_are_replies_not_crashes(worker):
    reply = load(worker, "raise SystemExit(0)\n")
    assert isinstance(reply, Failed) and reply.error_type == "SystemExit"
    assert worker.alive


def test_environment_is_scrubbed_and_temp_dir_is_private(worker, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret-token")
    monkeypatch.setenv("OPENAI_API_KEY", "secret-key")
    worker.kill()
    reply = load(worker, "import os\nopen('scratch.txt', 'w').write('x')\n"
                         "raise RuntimeError('CWD=' + os.getcwd() + ' ENV=' + ','.join(os.environ))\n")
    env = re.search(r"ENV=(\S*)", reply.error).group(1).split(",")
    assert "HF_TOKEN" not in env and "OPENAI_API_KEY" not in env and "PATH" in env
    workdir = re.search(r"CWD=(\S+)", reply.error).group(1)
    assert os.path.exists(os.path.join(workdir, "scratch.txt"))
    assert not os.getcwd().startswith(workdir)
    worker.call(Reset())
    assert os.listdir(workdir) == []
    worker.kill()
    assert not os.path.exists(workdir)


def test_the_hosts_pythonpath_reaches_the_worker(worker, monkeypatch, tmp_path):
    # A TPU image may install jax and libtpu on PYTHONPATH alone: a worker without it cannot start.
    (tmp_path / "installed_on_pythonpath.py").write_text("WHERE = 'host path'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    worker.kill()
    reply = load(worker, "import installed_on_pythonpath as m\nraise RuntimeError('FOUND ' + m.WHERE)\n")
    assert isinstance(reply, Failed) and "FOUND host path" in reply.error


def test_only_a_tpu_worker_keeps_the_hosts_chip_description(tmp_path):
    host = {"PATH": "/bin", "TPU_ACCELERATOR_TYPE": "v5litepod-1", "LIBTPU_INIT_ARGS": "--flag", "HF_TOKEN": "s"}
    on_chip = worker_environment(get_backend("tpu"), tmp_path, host)
    interpreted = worker_environment(get_backend("tpu-interpret"), tmp_path, host)
    assert on_chip["TPU_ACCELERATOR_TYPE"] == "v5litepod-1" and on_chip["LIBTPU_INIT_ARGS"] == "--flag"
    assert not any(k.startswith(("TPU_", "LIBTPU_")) for k in interpreted)
    assert "HF_TOKEN" not in on_chip and "HF_TOKEN" not in interpreted
    assert on_chip["JAX_PLATFORMS"] == "tpu" and interpreted["JAX_PLATFORMS"] == "cpu"


def test_the_tpu_backend_grades_on_one_worker_per_chip():
    """A second process cannot open a chip another holds: on the tpu backend the evaluator keeps
    one worker whatever it is asked for (none starts before a grading)."""
    from evaluator.grader import Evaluator

    with Evaluator(backend="tpu", workers=2) as on_chip, Evaluator(backend="tpu-interpret", workers=2) as interpreted:
        assert on_chip.workers == 1 and interpreted.workers == 2


def test_prints_do_not_corrupt_the_protocol(worker):
    assert isinstance(load(worker, "print('hello ' * 1000)\ndef kernel(x):\n    return x\n"), Done)
    assert worker.call(Ping(7))[0] == Pong(7)


def test_pool_replaces_a_dead_worker():
    with WorkerPool(get_backend("tpu-interpret"), size=1, limits=Limits(step_timeout_s=5)) as pool:
        with pool.lease() as w:
            with pytest.raises(WorkerError):
                w.call(Load("import os\nos._exit(1)\n"))
        with pool.lease() as w:
            assert w.call(Ping(1))[0] == Pong(1)


def test_lowering_sees_the_target_tpu_generation(worker):
    """Rank-1 blocks and `//` in index maps ask jax which TPU they lower for; on a CPU host the
    answer must be the target generation, or honest kernels would fail to lower."""
    from tests.conftest import HONEST

    source = (HONEST / "rms_norm_rank1_scale.py").read_text()
    case = CaseSpec("c", [([64, 256], "float32"), ([256], "float32")])
    assert isinstance(load(worker, source), Done)
    assert isinstance(worker.call(Trace([case]))[0], Traced)  # lowering reuses the trace
    as_cpu = worker.call(Lower([case]))[0]
    assert isinstance(as_cpu, Failed) and "device kind" in as_cpu.error
    worker.call(Reset())
    assert isinstance(load(worker, source, "TPU v5 lite"), Done)
    assert isinstance(worker.call(Trace([case]))[0], Traced)
    as_v5e = worker.call(Lower([case]))[0]
    assert isinstance(as_v5e, Done), as_v5e


def test_worker_has_no_network(worker):
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    source = ("import socket\n"
              f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
    reply = load(worker, source)
    server.close()
    if not worker.isolation.get("network"):
        pytest.skip("no network namespace on this system: the policy stage refuses socket imports")
    assert isinstance(reply, Failed) and reply.error_type in ("OSError", "ConnectionRefusedError",
                                                       "TimeoutError", "PermissionError")


def test_project_is_read_only_for_the_worker(worker):
    from evaluator.execution.sandbox import PROJECT_ROOT

    target = PROJECT_ROOT / "tasks" / "written_by_candidate.txt"
    reply = load(worker, f"open({str(target)!r}, 'w').write('x')\n")
    if not worker.isolation.get("read_only"):
        pytest.skip("no mount namespace on this system")
    assert isinstance(reply, Failed) and "Read-only file system" in reply.error
    assert not target.exists()


def test_segfault_becomes_a_crash(worker):
    with pytest.raises(WorkerError, match="SIGSEGV"):
        load(worker, "import ctypes\nctypes.string_at(0)\n")


def test_process_count_is_limited(worker):
    source = ("import subprocess\n"
              "started = 0\n"
              "try:\n"
              "    for _ in range(2000):\n"
              "        subprocess.Popen(['sleep', '30'])\n"
              "        started += 1\n"
              "except OSError as exc:\n"
              "    raise RuntimeError(f'stopped after {started}: {exc}')\n")
    reply = load(worker, source)
    if not worker.isolation.get("process_limit"):
        pytest.skip("no writable pids cgroup on this system")
    assert isinstance(reply, Failed) and "stopped after" in reply.error
    assert int(reply.error.split("stopped after ")[1].split(":")[0]) < 512
    worker.kill()  # the whole group goes, sleepers included
