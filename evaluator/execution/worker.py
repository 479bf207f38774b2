"""The worker process: runs untrusted candidate code on request, one candidate at a time.

Started by evaluator/execution/sandbox.py as `python -m evaluator.execution.worker`. It isolates itself
(evaluator/execution/isolation.py), imports JAX once, hooks what it needs in jax (evaluator/execution/jax_hooks.py)
and then serves typed requests (evaluator/execution/protocol.py) with evaluator/execution/handlers.py over its
stdin/stdout pipes, so many candidates share one start-up. Anything the candidate prints goes
to the worker's log, not the pipe.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time

from evaluator.execution import isolation, jax_hooks

# How often the worker checks that its host is still there (see watch_host).
HOST_CHECK_S = 0.5


def watch_host(host_pid: int, interval_s: float = HOST_CHECK_S) -> threading.Thread:
    """End this worker, and anything it started, within `interval_s` of its host's death.

    A host that dies (killed, interrupted while it waits on the pipe, its Ray actor lost)
    cannot kill its worker, and a worker deep in a kernel never reads the pipe that would tell
    it: it would run on, orphaned, for as long as the kernel does. The worker is reparented
    when its host dies, so a thread that sees its parent change kills the worker's process
    group (start_new_session made the worker its leader). A parent-death signal would need no
    thread, but Linux sends it when the *thread* that started the worker ends, and the host
    starts workers from pool threads that come and go."""
    def watch() -> None:
        while os.getppid() == host_pid:
            time.sleep(interval_s)
        if os.getpgrp() == os.getpid():  # never the group of whoever started a bare worker
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="host-watch", daemon=True)
    thread.start()
    return thread


def main() -> None:
    args = _parse_args()
    watch_host(os.getppid())
    # libtpu maps the chip's memory into the worker's address space (seen on a v5e: "Couldn't
    # mmap: Cannot allocate memory" under an 8 GiB cap), so a worker on a chip has no cap.
    isolation.limit_resources(0 if args.platform == "tpu" else args.memory_gb)
    granted = isolation.isolate(args.read_only, network=args.platform != "tpu")
    proto_in, proto_out = isolation.take_protocol_pipes()
    os.environ["JAX_PLATFORMS"] = args.platform
    import jax
    import numpy as np  # noqa: F401  (warm imports before "ready")

    from evaluator.candidate.errors import describe_exception
    from evaluator.execution import handlers, protocol, wire

    if args.platform == "cpu":
        jax.config.update("jax_platforms", "cpu")
    state = handlers.WorkerState(interpret=args.interpret)
    try:
        jax_hooks.install()
    except jax_hooks.HookError as exc:  # an evaluator that cannot see races, deadlocks or unwaited copies must not grade
        wire.write_message(proto_out, protocol.to_header(protocol.Refused(str(exc))))
        return
    wire.write_message(proto_out, protocol.to_header(protocol.Ready(os.getpid(), jax.__version__, granted)))
    while True:
        try:
            header, arrays = wire.read_message(proto_in)
        except wire.PeerClosed:
            return
        try:
            request = protocol.from_header(header)
            reply, out_arrays = handlers.handle(state, request, arrays)
        except Exception as exc:  # a bug in the evaluator: reply, never hang; the host raises
            etype, text = describe_exception(exc)
            reply, out_arrays = protocol.Failed(etype, text, internal=True), []
        wire.write_message(proto_out, protocol.to_header(reply), out_arrays)


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--platform", default="cpu")
    p.add_argument("--interpret", action="store_true")
    p.add_argument("--memory-gb", type=float, default=0)
    p.add_argument("--read-only", action="append", default=[],
                   help="a directory to make read-only for this worker (repeatable)")
    return p.parse_args()


if __name__ == "__main__":
    main()
