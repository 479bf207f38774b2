"""The worker's few reaches into jax internals, in one place so a jax upgrade breaks here,
loudly, and nowhere else.

- Interpret mode only prints the data races it detects: we record them so a race becomes
  a verdict (`install_race_recorder`, `take_races`), and hold each access against the
  buffer's earlier ones in one numpy comparison rather than a Python call each
  (`AccessLog`): the same races, found in a fraction of the time.
- Pallas code that asks which TPU it runs on must hear the target chip on a CPU host
  (`pretend_device_kind`).
- Interpret mode keeps per-kernel state between calls (`reset_interpret_state`).
- Interpret mode waits forever on a semaphore nothing will signal (a DMA started into the
  wrong slot, a wait with no start): on one core that is a certain deadlock, and we fail
  the wait at once with the semaphore's counts (`install_deadlock_detector`) rather than
  leave the worker to its time limit.
- Interpret mode only prints a semaphore left non-zero at a kernel's exit, and does not see a
  DMA started and never waited at all (its copies run when waited on): we record both
  (`install_exit_check`, `take_unwaited`), since on a TPU that copy is still in flight when
  the kernel returns.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any

_RACES: list[str] = []
_UNWAITED: list[str] = []
_SAVED_DEVICE_QUERIES: tuple | None = None


class HookError(RuntimeError):
    """A private jax hook the worker relies on is gone (a jax upgrade): fail loudly."""


def install_race_recorder() -> None:
    """Make interpret mode's race detector record what it finds (it only prints), checking each
    access against its buffer's access logs at once (AccessLog)."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

        base = ipc.RaceDetectionState
    except (ImportError, AttributeError) as exc:
        raise HookError("cannot record data races: jax._src.pallas.mosaic.interpret."
                        f"interpret_pallas_call.RaceDetectionState is gone ({exc}); the evaluator "
                        f"needs updating for jax {jax_version()}") from None
    if "races_found" not in {f.name for f in dataclasses.fields(base)}:
        raise HookError("cannot record data races: RaceDetectionState no longer has races_found; "
                        f"the evaluator needs updating for jax {jax_version()}")

    try:
        from jax._src.pallas.mosaic.interpret.race_detection_state import _ranges_overlap
    except ImportError as exc:
        raise HookError(f"cannot check data races: {exc}; the evaluator needs updating for jax "
                        f"{jax_version()}") from None
    for method in ("check_read", "check_write"):
        params = list(inspect.signature(getattr(base, method)).parameters)
        if params[:6] != ["self", "device_id", "local_core_id", "clock", "buffer_key", "rnge"]:
            raise HookError(f"cannot check data races: RaceDetectionState.{method} now takes {params}; "
                            f"the evaluator needs updating for jax {jax_version()}")

    @dataclasses.dataclass
    class RecordingRaceState(base):  # type: ignore[misc, valid-type]
        """jax's detector with its two checks done over whole access logs (AccessLog): a read
        races an earlier write, a write an earlier write or read, when their vector clocks are
        unordered and their ranges overlap, as in jax's own check_read and check_write."""

        access_logs: dict = dataclasses.field(default_factory=dict)

        def __setattr__(self, name: str, value: Any) -> None:
            if name == "races_found" and value:
                _RACES.append("race")
            super().__setattr__(name, value)

        def _check(self, clock: Any, buffer_key: Any, rnge: Any, kind: str, against: tuple[str, ...]) -> None:
            with self.lock:
                earlier = [self.access_logs.setdefault((k, buffer_key), AccessLog()).snapshot() for k in against]
                self.access_logs.setdefault((kind, buffer_key), AccessLog()).append(clock, rnge)
            if any(unordered_overlap(*logged, clock, rnge, _ranges_overlap) for logged in earlier):
                with self.lock:
                    self.races_found = True

        def check_read(self, device_id, local_core_id, clock, buffer_key, rnge, source_info=None):  # type: ignore[no-untyped-def]
            self._check(clock, buffer_key, rnge, "read", ("write",))

        def check_write(self, device_id, local_core_id, clock, buffer_key, rnge, source_info=None):  # type: ignore[no-untyped-def]
            self._check(clock, buffer_key, rnge, "write", ("read", "write"))

    ipc.RaceDetectionState = RecordingRaceState


class AccessLog:
    """One buffer's reads (or writes) in a race-detecting run: the accesses' vector clocks stacked
    in one array that grows by doubling, their ranges, and the clocks' elementwise maximum. jax's
    detector holds a new access against each earlier one in a Python call, quadratic in a kernel's
    accesses at a few microseconds a pair (moe_unpermute's solution: 110 of its 115 s at its f32
    coverage size)."""

    def __init__(self) -> None:
        self.clocks: Any = None
        self.ranges: list[Any] = []
        self.latest: Any = None

    def append(self, clock: Any, rnge: Any) -> None:
        import numpy as np

        n = len(self.ranges)
        if self.clocks is None or n == len(self.clocks):
            grown = np.empty((max(16, 2 * n), len(clock)), dtype=np.asarray(clock).dtype)
            if n:
                grown[:n] = self.clocks[:n]
            self.clocks = grown  # a snapshot taken before still reads the old array's first rows
        self.clocks[n] = clock
        self.ranges.append(rnge)
        self.latest = np.maximum(self.latest, clock) if n else np.array(clock)

    def snapshot(self) -> tuple[Any, list[Any], int, Any]:
        """What was logged so far; later appends leave its first `n` rows as they are."""
        return self.clocks, self.ranges, len(self.ranges), self.latest


def unordered_overlap(clocks: Any, ranges: list[Any], n: int, latest: Any, clock: Any, rnge: Any,
                      overlap: Any) -> bool:
    """Whether one of the first `n` logged accesses is neither before nor after `clock` (jax's
    vector_clock.ordered: one clock <= the other everywhere and < somewhere) and overlaps `rnge`.
    When their maximum is before `clock`, every one of them is (none can equal it): the common
    case, a core's accesses after it waited for its copies, costs one comparison."""
    if n == 0 or ((latest <= clock).all() and (latest < clock).any()):
        return False
    prior = clocks[:n]
    before = (prior <= clock).all(axis=1) & (prior < clock).any(axis=1)
    after = (prior >= clock).all(axis=1) & (prior > clock).any(axis=1)
    return any(overlap(rnge, ranges[i]) for i in (~(before | after)).nonzero()[0])


_SEMAPHORE_STATE = ("self.count_by_core", "self.tasks", "self.cv", "def num_cores")


class DeadlockError(RuntimeError):
    """A semaphore wait that nothing left in the kernel can satisfy."""


def install_deadlock_detector() -> None:
    """Fail a single-core semaphore wait at once when nothing pending can signal it.

    Interpret mode's wait runs the DMAs queued on the semaphore until its count suffices,
    then sleeps in 0.1 s steps for a signal from another core. With one core there is no
    other core: once the queue is empty and the count short, the wait can never end (on a
    TPU the kernel hangs the same way).
    """
    try:
        from jax._src.pallas.mosaic.interpret import shared_memory as memory

        base = memory.Semaphore
    except (ImportError, AttributeError) as exc:
        raise HookError("cannot detect deadlocks: jax._src.pallas.mosaic.interpret.shared_memory."
                        f"Semaphore is gone ({exc}); the evaluator needs updating for jax {jax_version()}") from None
    if getattr(base, "detects_deadlocks", False):
        return  # installed already
    # the wait below reads these; were one renamed, a kernel would be blamed for our AttributeError
    missing = [name for name in _SEMAPHORE_STATE if name not in inspect.getsource(base)]
    if missing:
        raise HookError(f"cannot detect deadlocks: interpret mode's Semaphore no longer has {missing}; "
                        f"the evaluator needs updating for jax {jax_version()}")

    class DeadlockDetectingSemaphore(base):  # type: ignore[misc, valid-type]
        detects_deadlocks = True

        def wait(self, value, global_core_id, **kwargs):  # type: ignore[no-untyped-def]
            if self.num_cores == 1:
                core = int(global_core_id)
                while True:
                    with self.cv:
                        count, pending = int(self.count_by_core[core]), self.tasks[core]
                        if count >= value:
                            break
                        if not pending:
                            raise DeadlockError(
                                f"deadlock: a semaphore wait needs {value} and the semaphore holds {count} "
                                "(a DMA semaphore counts bytes), with no DMA or signal left to raise it: the kernel "
                                "waits forever (a copy never started, or started on another slot or "
                                "semaphore than the one waited on?)")
                        task = pending.pop()
                    task()
            return super().wait(value, global_core_id, **kwargs)

    memory.Semaphore = DeadlockDetectingSemaphore


def install() -> None:
    """Every hook a grading worker needs; HookError if jax no longer has what one reaches."""
    install_race_recorder()
    install_deadlock_detector()
    install_exit_check()


_SHARED_MEMORY_STATE = ("self.sem[", "self.fixed_id_sem[", "self.lock", "def get_global_core_ids")


def install_exit_check() -> None:
    """Record, at each kernel's exit, the semaphores it leaves busy.

    A DMA semaphore with a copy still queued on it (interpret mode runs a copy when it is
    waited on, so an unwaited one never runs) or a count left over (a copy or signal nobody
    waited for) means the kernel returned with work in flight: on a TPU that copy lands after
    the kernel, in memory the next program owns. Interpret mode's own exit check (`_validate`)
    prints a non-zero count and misses the queued copy.
    """
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
        from jax._src.pallas.mosaic.interpret import shared_memory as memory

        validate, get_memory = ipc._validate, ipc._get_shared_memory
        source = inspect.getsource(memory.SharedMemory)
    except (ImportError, AttributeError) as exc:
        raise HookError("cannot check semaphores at kernel exit: jax._src.pallas.mosaic.interpret."
                        f"interpret_pallas_call._validate is gone ({exc}); the evaluator needs "
                        f"updating for jax {jax_version()}") from None
    if getattr(validate, "records_unwaited", False):
        return  # installed already
    missing = [name for name in _SHARED_MEMORY_STATE if name not in source]
    if missing:
        raise HookError(f"cannot check semaphores at kernel exit: interpret mode's SharedMemory no longer "
                        f"has {missing}; the evaluator needs updating for jax {jax_version()}")

    def check_then_validate(token, device_id):  # type: ignore[no-untyped-def]
        shared = get_memory()
        with shared.lock:
            semaphores = [*shared.sem.values(), *shared.fixed_id_sem.values()]
        for sem in semaphores:
            for core in shared.get_global_core_ids(int(device_id)):
                with sem.cv:
                    count, queued = int(sem.count_by_core[core]), len(sem.tasks[core])
                if count or queued:
                    _UNWAITED.append(f"semaphore {sem.id} holds {count} with {queued} copies queued")
        return validate(token, device_id)

    check_then_validate.records_unwaited = True  # type: ignore[attr-defined]
    ipc._validate = check_then_validate


def take_unwaited() -> list[str]:
    """Semaphores kernels left busy at exit since the last call (and forget them)."""
    found = list(_UNWAITED)
    del _UNWAITED[:]
    return found


def take_races() -> int:
    """Races recorded since the last call (and forget them)."""
    found = len(_RACES)
    del _RACES[:]
    return found


def pretend_device_kind(device_kind: str | None) -> None:
    """Make Pallas code that asks "which TPU is this?" see the target chip, until reset.

    Some lowering rules (rank-1 blocks, `//` in index maps, sign) and emit_pipeline's tiling
    query the default device, which is the CPU here, and fail with "Unsupported TPU device
    kind: cpu". Only the answer to that question changes; interpret mode is still chosen by
    its own flag. With None (a TPU host, or a reset) the real queries come back.
    """
    global _SAVED_DEVICE_QUERIES
    from jax._src.pallas.mosaic import tpu_info

    if _SAVED_DEVICE_QUERIES is None:
        _SAVED_DEVICE_QUERIES = (tpu_info.get_device_kind, tpu_info.get_num_device_cores)
    if device_kind:
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = (lambda: device_kind), (lambda: 1)
    else:
        tpu_info.get_device_kind, tpu_info.get_num_device_cores = _SAVED_DEVICE_QUERIES


def reset_interpret_state() -> None:
    try:
        from jax.experimental.pallas import tpu as pltpu

        pltpu.reset_tpu_interpret_mode_state()
    except Exception:
        pass


def jax_version() -> str:
    import jax

    return jax.__version__
