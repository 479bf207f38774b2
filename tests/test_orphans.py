"""No worker outlives its host: a host killed (SIGKILL) or interrupted (SIGINT, Ctrl-C) in the
middle of a grading leaves no worker running the kernel (evaluator/execution/worker.py, watch_host)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from evaluator.execution.worker import HOST_CHECK_S
from tests.conftest import ROOT, read_candidate

# A host that starts its worker, says its pid, and grades a kernel that never ends. No
# `with` and no close(): what a host that dies leaves behind is what is tested. Ctrl-C raises
# KeyboardInterrupt as in a terminal (a test runner's process may ignore SIGINT, and its
# children would inherit that).
HOST = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from evaluator.grader import Evaluator
evaluator = Evaluator(workers=1)
evaluator.warm_up()
print(evaluator.pool._all[0].proc.pid, flush=True)
evaluator.grade("matmul", sys.stdin.read())
"""


def _gone(pid: int) -> bool:
    """Dead, or a zombie nobody has reaped yet (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.1)
    return _gone(pid)


@pytest.mark.parametrize("how", [signal.SIGKILL, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGKILL", "SIGINT"])
def test_a_dead_host_leaves_no_worker(how):
    host = subprocess.Popen([sys.executable, "-c", HOST], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        host.stdin.write(read_candidate("timeout_kernel_loop"))
        host.stdin.close()
        worker = int(host.stdout.readline())
        time.sleep(6)  # load, trace, lower: by now the worker spins in the kernel
        assert not _gone(worker), "the worker should still be grading"
        host.send_signal(how)
        host.wait(timeout=60)
        assert _wait_gone(worker, within_s=10 * HOST_CHECK_S + 5), f"worker {worker} outlived its host"
    finally:
        host.kill()
        host.wait()
