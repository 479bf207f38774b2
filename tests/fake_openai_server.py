"""A tiny OpenAI-compatible HTTP server for tests: real sockets, real client, canned answers.

Tests of `chat.models` talk to it through the official `openai` client, so the client's
request format, retries and error mapping are exercised rather than mocked.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

Respond = Callable[[list[dict[str, Any]], str], str]


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops SYNs when 8+ clients connect at once, and each drop
    # costs the client a 1 s retransmit: a slow concurrency test for no reason.
    request_queue_size = 128
    daemon_threads = True


class FakeOpenAIServer:
    """Serves `GET /v1/models` and `POST /v1/chat/completions` on 127.0.0.1 (a free port).

    `respond(messages, model)` makes each answer. `fail_first=N` answers HTTP 500 to the first N
    completion requests, to exercise client retries. Every completion request body (failed ones
    included) is appended to `requests`, so tests can count attempts.
    """

    def __init__(
        self,
        respond: Respond,
        *,
        fail_first: int = 0,
        models: Sequence[str] = ("fake-model",),
    ) -> None:
        self.respond = respond
        self.fail_first = fail_first
        self.models = tuple(models)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started: use it as a context manager"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self._httpd = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _record(self, body: dict[str, Any]) -> int:
        """Store a completion request; returns its 0-based index (decides fail_first)."""
        with self._lock:
            self.requests.append(body)
            return len(self.requests) - 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

            def _send_json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, type_: str) -> None:
                self._send_json(status, {"error": {"message": message, "type": type_, "code": status}})

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    created = int(time.time())
                    data = [
                        {"id": m, "object": "model", "created": created, "owned_by": "fake"}
                        for m in server.models
                    ]
                    self._send_json(200, {"object": "list", "data": data})
                else:
                    self._error(404, f"no route {self.path}", "not_found")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._error(404, f"no route {self.path}", "not_found")
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError as err:
                    self._error(400, f"bad json: {err}", "invalid_request_error")
                    return
                index = server._record(body)
                if index < server.fail_first:
                    self._error(500, "injected failure", "server_error")
                    return
                model = body.get("model", "")
                if model not in server.models:  # like vLLM: 404 for a model it does not serve
                    self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
                    return
                messages = body.get("messages", [])
                try:
                    text = server.respond(messages, model)
                except Exception as err:  # noqa: BLE001 -- a broken respond() shows up as a 500, not a hang
                    self._error(500, f"respond() raised {type(err).__name__}: {err}", "server_error")
                    return
                prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
                completion_tokens = len(text.split())
                self._send_json(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                        },
                    },
                )

        return Handler
