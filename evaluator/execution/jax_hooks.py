"""The worker's few reaches into jax internals, in one place so a jax upgrade breaks here,
loudly, and nowhere else.

- Interpret mode only prints the data races it detects: we record them so a race becomes
  a verdict (`install_race_recorder`, `take_races`).
- Pallas code that asks which TPU it runs on must hear the target chip on a CPU host
  (`pretend_device_kind`).
- Interpret mode keeps per-kernel state between calls (`reset_interpret_state`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

_RACES: list[str] = []
_SAVED_DEVICE_QUERIES: tuple | None = None


class HookError(RuntimeError):
    """A private jax hook the worker relies on is gone (a jax upgrade): fail loudly."""


def install_race_recorder() -> None:
    """Make interpret mode's race detector record what it finds (it only prints)."""
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

    class RecordingRaceState(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "races_found" and value:
                _RACES.append("race")
            super().__setattr__(name, value)

    ipc.RaceDetectionState = RecordingRaceState


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
