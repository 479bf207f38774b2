"""Grading fanned out over a Ray cluster: `Evaluator(executor="ray", address=...)`.

Each Ray actor owns an ordinary local `Evaluator` with its own warm, sandboxed worker process
(`evaluator.grader.GradingActor`), so a cluster relaxes nothing about isolation. The driver
sends (task, answer, split, seed, stage) and gets the verdict back as plain data. The task travels
as itself, pickled: a replaced Task stays replaced, an imported one is rebuilt on the actor from
its suite (tasks.spec.Task.__reduce_ex__). Ray is imported only when a `RayExecutor` is made.

- Back-pressure: one grading in flight per actor. A caller waits for an idle actor.
- Lost actors: an actor that dies mid-grade is replaced, and its candidate is graded again on
  another actor. The caller gets one verdict, so a journal sees it once.
- A candidate that keeps killing actors is tried `max_attempts` times. Then `ActorsLost` tells
  the evaluator to give it a `runtime_error` verdict that says so.
"""
from __future__ import annotations

import queue
import socket
import threading
from typing import Any

from tasks.spec import Task


class ActorsLost(RuntimeError):
    """A candidate's gradings killed every actor they ran on, `max_attempts` times."""

    def __init__(self, deaths: list[str]):
        super().__init__(f"{len(deaths)} actors lost: {', '.join(deaths)}")
        self.deaths = deaths


class RayExecutor:
    """A fixed set of grading actors, each used by one caller at a time."""

    def __init__(self, address: str | None, actors: int, actor_class: type, options: dict[str, Any],
                 max_attempts: int = 3):
        """`actor_class(options)` is built in each actor process; its `grade(task, answer, split,
        seed, through)` returns a verdict as a dict."""
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs Ray: pip install -e '.[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            check_reachable(address)
            try:
                # "local" starts a private cluster on this machine; other addresses join one
                ray.init(address=None if address in (None, "local") else address, log_to_driver=False,
                         include_dashboard=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ValueError(f"cannot reach the Ray cluster at {address!r}: {' '.join(str(exc).split())[:200]}"
                                 ) from None
        self.options = options
        self.max_attempts = max_attempts
        self._actor_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(actor_class)
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.actors: list[Any] = []
        for _ in range(actors):
            self._idle.put(self._start_actor())
        self.replaced = 0

    def _start_actor(self) -> Any:
        actor = self._actor_class.remote(self.options)
        with self._lock:
            self.actors.append(actor)
        return actor

    def _retire(self, actor: Any) -> Any:
        """Drop a dead actor and start its replacement."""
        with self._lock:
            if actor in self.actors:
                self.actors.remove(actor)
            self.replaced += 1
        return self._start_actor()

    def grade(self, task: Task, answer: str, split: str, seed: int | None, through: str | None
              ) -> dict[str, Any]:
        """The verdict as a dict; ActorsLost when every try lost its actor."""
        errors = self._ray.exceptions
        deaths: list[str] = []
        while len(deaths) < self.max_attempts:
            actor = self._idle.get()   # blocks while every actor is busy: bounded in-flight work
            try:
                data = self._ray.get(actor.grade.remote(task, answer, split, seed, through))
            except (errors.RayActorError, errors.ActorUnavailableError) as exc:
                deaths.append(type(exc).__name__)
                self._idle.put(self._retire(actor))
                continue
            except BaseException:
                self._idle.put(actor)
                raise
            self._idle.put(actor)
            return data
        raise ActorsLost(deaths)

    def close(self) -> None:
        with self._lock:
            actors, self.actors = self.actors, []
        for actor in actors:
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail in seconds when a `host:port` or `ray://host:port` address does not answer: Ray's own
    connection attempts wait minutes. "auto" and "local" need no network."""
    if address in (None, "auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray {address!r}: expected auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
