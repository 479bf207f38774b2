"""Worker processes for untrusted candidates: limits, timeouts, crash recovery, reuse.

Each worker is its own process group with a private temp dir as cwd, a scrubbed
environment and an address-space cap. The host talks to it over pipes and never waits
past a deadline: a hung worker is killed with its whole group, a dead one is noticed at
once, and either way the next request gets a fresh worker.
"""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from evaluator.execution import protocol, wire
from evaluator.execution.backends import Backend

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Only these survive into a worker's environment: no tokens, keys or proxies.
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_TPU_ENV_PREFIXES = ("TPU_", "LIBTPU_")


@dataclass(frozen=True)
class Limits:
    step_timeout_s: float = 120.0    # one request (load, trace, lower), the base of a case's run
    run_ceiling_s: float = 900.0     # the most a case's run may be granted (evaluator/execution/step_limits.py)
    compile_timeout_s: float = 300.0  # one libtpu compile (tpu-compile); over-sized VMEM fails slowly
    startup_timeout_s: float = 90.0  # importing JAX in a new worker
    memory_gb: float = 8.0           # address space of a worker
    max_processes: int = 512         # processes + threads of a worker (JAX itself runs ~30)
    max_jobs_per_worker: int = 200   # recycle now and then so leaks cannot accumulate


class WorkerError(RuntimeError):
    """A worker could not answer: it timed out or died. The worker is gone."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" or "crash"


class EvaluatorBug(RuntimeError):
    """The evaluator's own code failed in a worker: loud, never turned into a verdict."""


def worker_environment(backend: Backend, workdir: Path, host: dict[str, str]) -> dict[str, str]:
    """The scrubbed environment a worker starts with. The host's PYTHONPATH stays behind the
    project's: a TPU image may install jax and libtpu only there. On a real TPU the host's
    TPU_* and LIBTPU_* variables stay too: they describe the chip libtpu is to open."""
    env = {k: v for k, v in host.items()
           if k in _ENV_KEEP or (backend.platform == "tpu" and k.startswith(_TPU_ENV_PREFIXES))}
    env.update(HOME=str(workdir), TMPDIR=str(workdir),
               PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), host.get("PYTHONPATH", "")) if p),
               PYTHONDONTWRITEBYTECODE="1", JAX_PLATFORMS=backend.platform, TF_CPP_MIN_LOG_LEVEL="2")
    return env


class Worker:
    """One worker process. Not thread-safe: a pool hands it to one thread at a time."""

    def __init__(self, backend: Backend, limits: Limits):
        self.backend, self.limits = backend, limits
        self.proc: subprocess.Popen | None = None
        self.root: Path | None = None
        self.jobs = 0
        self.isolation: dict[str, bool] = {}  # what the OS granted: network, read_only, process_limit
        self.cgroup: Path | None = None

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pallas-eval-"))
        workdir = self.root / "work"
        workdir.mkdir()
        env = worker_environment(self.backend, workdir, os.environ)
        if self.backend.topology_compile:
            # libtpu compiles for a described topology; these keep it from probing for a TPU.
            # No chip is claimed, so several workers may load libtpu at once (it would
            # otherwise lock /tmp/libtpu_lockfile for the first one).
            env.update(TPU_SKIP_MDS_QUERY="1", TPU_ACCELERATOR_TYPE="v5litepod-4",
                       TPU_WORKER_HOSTNAMES="localhost", TPU_WORKER_ID="0",
                       ALLOW_MULTIPLE_LIBTPU_LOAD="1")
        cmd = [sys.executable, "-m", "evaluator.execution.worker", "--platform", self.backend.platform,
               "--memory-gb", str(self.limits.memory_gb), "--read-only", str(PROJECT_ROOT)]
        if self.backend.interpret:
            cmd.append("--interpret")
        self.log_path = self.root / "worker.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, cwd=workdir, env=env, start_new_session=True)
        self.jobs = 0
        self.cgroup = _limit_processes(self.proc.pid, self.limits.max_processes)
        ready, _ = self._receive(self.limits.startup_timeout_s, "starting the worker")
        if isinstance(ready, protocol.Refused):  # the evaluator cannot work here: loud, never a verdict
            self.kill()
            raise EvaluatorBug(f"the worker refused to start: {ready.error}")
        if not isinstance(ready, protocol.Ready):
            self.kill()
            raise WorkerError("crash", f"worker failed to start: {ready}")
        self.isolation = {**ready.isolation, "process_limit": self.cgroup is not None}

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the whole process group (the candidate may have spawned children). Safe to call
        from another thread while this one starts or waits (Evaluator.close on Ctrl-C)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(Exception):
                    stream.close()
        if self.cgroup is not None:
            for _ in range(40):  # empty once the killed children are reaped: a moment
                try:
                    self.cgroup.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            self.cgroup = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- requests -----------------------------------------------------------------------
    def call(self, request: protocol.Request, arrays: list[np.ndarray] = (),
             timeout_s: float | None = None, what: str = "") -> tuple[protocol.Reply, list[np.ndarray]]:
        """Send a request (evaluator/execution/protocol.py); its reply, or `Failed` when the candidate's
        code failed. Raises WorkerError if the worker hangs or dies, EvaluatorBug if our own
        code failed in it."""
        what = what or type(request).__name__.lower()
        if not self.alive:
            self.start()
        try:
            wire.write_message(self.proc.stdin, protocol.to_header(request), list(arrays))
        except (BrokenPipeError, OSError, AttributeError):  # AttributeError: killed meanwhile
            raise self._crashed(what) from None
        reply, out = self._receive(timeout_s or self.limits.step_timeout_s, what)
        if isinstance(reply, protocol.Failed) and reply.internal:
            raise EvaluatorBug(f"the worker failed while {what}: {reply.error_type}: {reply.error}")
        return reply, out

    def _receive(self, timeout_s: float, what: str) -> tuple[protocol.Reply, list[np.ndarray]]:
        deadline = time.monotonic() + timeout_s
        proc = self.proc
        if proc is None:  # killed by another thread (Evaluator.close) since it was started
            raise self._crashed(what)
        try:
            header, arrays = wire.read_message_fd(proc.stdout.fileno(), deadline)
            return protocol.from_header(header), arrays
        except wire.PeerTimeout:
            self.kill()
            raise WorkerError("timeout", f"no result after {timeout_s:g} s while {what}") from None
        except (wire.PeerClosed, wire.ProtocolError):
            raise self._crashed(what) from None

    def _crashed(self, what: str) -> WorkerError:
        code, proc = None, self.proc
        if proc is not None:
            with contextlib.suppress(Exception):
                code = proc.wait(timeout=5)
        tail = self.log_tail()
        self.kill()
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        hint = ""
        if "MemoryError" in tail or "RESOURCE_EXHAUSTED" in tail or "bad_alloc" in tail \
                or code == -signal.SIGABRT:
            hint = f" (probably over the {self.limits.memory_gb:g} GiB memory limit)"
        message = f"the worker process died while {what}: {how}{hint}"
        if tail:
            message += f"; last output: {tail}"
        return WorkerError("crash", message)

    def log_tail(self, n_chars: int = 400) -> str:
        try:
            data = self.log_path.read_bytes()[-4000:].decode(errors="replace")
        except (OSError, AttributeError):
            return ""
        lines = [ln for ln in data.strip().splitlines() if ln.strip()]
        return " | ".join(lines[-4:])[-n_chars:]


_PIDS_CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1, v2


def _limit_processes(pid: int, max_processes: int) -> Path | None:
    """Put a worker in its own pids cgroup (processes + threads <= max_processes): a fork bomb
    fails with EAGAIN instead of taking the machine. Best effort: None where cgroups are not
    writable (RLIMIT_NPROC would not help: it does not bind root, and counts per user)."""
    for root in _PIDS_CGROUP_ROOTS:
        if not (root / "pids.max").exists() and not (root / "cgroup.procs").exists():
            continue
        group = root / f"pallas-eval-{pid}"
        try:
            group.mkdir(exist_ok=True)
            (group / "pids.max").write_text(str(max_processes))
            (group / "cgroup.procs").write_text(str(pid))
            return group
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None


class WorkerPool:
    """A fixed number of reusable workers. `lease()` yields a healthy one."""

    def __init__(self, backend: Backend, size: int = 1, limits: Limits = Limits()):
        self.backend, self.limits = backend, limits
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._all: list[Worker] = []
        for _ in range(size):
            worker = Worker(backend, limits)
            self._all.append(worker)
            self._idle.put(worker)
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Start every worker now, in parallel, instead of on first use."""
        threads = [threading.Thread(target=w.start) for w in self._all if not w.alive]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    @contextlib.contextmanager
    def lease(self) -> Iterator[Worker]:
        worker = self._idle.get()
        try:
            yield worker
        finally:
            worker.jobs += 1
            if worker.alive and worker.jobs >= self.limits.max_jobs_per_worker:
                worker.kill()
            self._idle.put(worker)

    def close(self) -> None:
        for worker in self._all:
            worker.kill()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
