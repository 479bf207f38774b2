"""What a worker process does to itself before any candidate runs: resource limits, no
network, read-only project files, and the protocol pipes kept out of the candidate's reach.

Best effort where the system refuses (no root, no user namespaces): the worker says what it
was granted (`Ready.isolation`) and the static policy still refuses network, process and
file modules.
"""
from __future__ import annotations

import os
import resource
import sys
from typing import BinaryIO

# A backstop against a runaway worker outliving its host: per-step wall-clock limits bound
# each candidate, and the pool recycles a worker every few hundred candidates.
WORKER_CPU_SECONDS = 4 * 3600

_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def limit_resources(memory_gb: float) -> None:
    """Address-space cap (allocations past it fail inside the worker, not on the host) and
    a lifetime CPU-time cap."""
    if memory_gb > 0:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (WORKER_CPU_SECONDS, WORKER_CPU_SECONDS))


def isolate(read_only: list[str], network: bool = True) -> dict[str, bool]:
    """A network namespace with no interfaces up (no network at all, loopback included) and
    read-only views of `read_only` directories (a private mount namespace). Needs root or user
    namespaces. On a TPU host the network stays (`network=False`): libtpu may need it."""
    import ctypes

    done = {"network": False, "read_only": False}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return done
    if network and libc.unshare(_CLONE_NEWNET) == 0:
        done["network"] = True
    if read_only and libc.unshare(_CLONE_NEWNS) == 0 and \
            libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0:
        ok = True
        for path in read_only:
            p = os.fsencode(path)
            ok &= libc.mount(p, p, None, _MS_BIND | _MS_REC, None) == 0 and \
                libc.mount(p, p, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) == 0
        done["read_only"] = bool(ok)
    return done


def take_protocol_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Keep private copies of stdin/stdout for the protocol; point fd 0/1 elsewhere, so what
    a candidate prints lands in the worker's log and cannot corrupt a reply."""
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    return proto_in, proto_out
