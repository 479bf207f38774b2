"""The wire format between the host and a worker: a JSON header plus raw array bytes.

No pickle in either direction: the worker runs untrusted code, so what it sends back must
be data the host can decode without executing anything. What the headers mean (the typed
requests and replies) is evaluator/execution/protocol.py.
"""
from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any, BinaryIO

import numpy as np

from tasks.spec import np_dtype

_LEN = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 1 << 31


class ProtocolError(RuntimeError):
    """The peer sent something that is not a well-formed message."""


class PeerTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class PeerClosed(EOFError):
    """The peer closed its end (the worker died)."""


def encode(header: dict[str, Any], arrays: list[np.ndarray] = ()) -> bytes:
    metas, blobs = [], []
    for a in arrays:
        a = np.asarray(a)  # not ascontiguousarray: it turns 0-d (scalar) outputs into shape (1,)
        metas.append({"dtype": a.dtype.name, "shape": list(a.shape), "nbytes": a.nbytes})
        blobs.append(a.tobytes())
    head = json.dumps({**header, "_arrays": metas}).encode()
    body = b"".join(blobs)
    return _LEN.pack(len(head)) + _LEN.pack(len(body)) + head + body


def decode(head: bytes, body: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    try:
        header = json.loads(head)
        metas = header.pop("_arrays")
        arrays, offset = [], 0
        for m in metas:
            n = int(m["nbytes"])
            chunk = body[offset: offset + n]
            arrays.append(np.frombuffer(chunk, np_dtype(m["dtype"])).reshape(m["shape"]))
            offset += n
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed message: {exc}") from None
    return header, arrays


def write_message(stream: BinaryIO, header: dict[str, Any], arrays: list[np.ndarray] = ()) -> None:
    stream.write(encode(header, arrays))
    stream.flush()


def read_message(stream: BinaryIO) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Blocking read, used by the worker on its request pipe."""
    lengths = _read_exact_blocking(stream, 2 * _LEN.size)
    head_len, body_len = _LEN.unpack(lengths[:8])[0], _LEN.unpack(lengths[8:])[0]
    return decode(_read_exact_blocking(stream, head_len), _read_exact_blocking(stream, body_len))


def read_message_fd(fd: int, deadline: float) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Read one message from a raw fd, giving up at `deadline` (time.monotonic())."""
    lengths = _read_exact_fd(fd, 2 * _LEN.size, deadline)
    head_len, body_len = _LEN.unpack(lengths[:8])[0], _LEN.unpack(lengths[8:])[0]
    if head_len + body_len > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {head_len + body_len} bytes is too large")
    return decode(_read_exact_fd(fd, head_len, deadline), _read_exact_fd(fd, body_len, deadline))


def _read_exact_blocking(stream: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            raise PeerClosed("peer closed the pipe")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_exact_fd(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerTimeout("no reply before the deadline")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise PeerClosed("peer closed the pipe")
        buf += chunk
    return bytes(buf)
