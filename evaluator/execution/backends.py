"""Where candidates run. `tpu-interpret` needs no TPU; `tpu` is a real TPU host."""
from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    platform: str            # JAX_PLATFORMS for the worker
    interpret: bool          # run kernels in Pallas TPU interpret mode
    device_compile: bool     # stage 6 compiles with the real TPU compiler
    times_kernels: bool      # stage 8 runs (real hardware only)
    description: str
    topology_compile: bool = False  # stage 6 compiles with libtpu for a named generation, no TPU


BACKENDS: dict[str, Backend] = {
    "tpu-interpret": Backend(
        "tpu-interpret", "cpu", interpret=True, device_compile=False, times_kernels=False,
        description="Pallas TPU interpret mode on the CPU: models VMEM/SMEM, DMAs and semaphores, "
                    "detects races and out-of-bounds accesses. No timing."),
    "tpu-compile": Backend(
        "tpu-compile", "cpu", interpret=True, device_compile=False, times_kernels=False,
        topology_compile=True,
        description="tpu-interpret plus a full libtpu compile for a named TPU generation "
                    "(--tpu), without a TPU: catches VMEM exhaustion and Mosaic layout errors. "
                    "Needs pip install '.[tpu-compile]'."),
    "tpu": Backend(
        "tpu", "tpu", interpret=False, device_compile=True, times_kernels=True,
        description="A real TPU: compiled by libtpu, run on the chip, timed against XLA."),
}


def tpu_present() -> bool:
    """A TPU VM exposes its chips as /dev/accel* (v2-v4) or /dev/vfio/* (v5e and later)."""
    if os.environ.get("PALLAS_EVAL_ASSUME_NO_TPU"):
        return False
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def default_backend() -> str:
    return "tpu" if tpu_present() else "tpu-interpret"


def get_backend(name: str) -> Backend:
    try:
        backend = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None
    if backend.topology_compile and importlib.util.find_spec("libtpu") is None:
        raise ValueError("the tpu-compile backend needs libtpu: pip install -e '.[tpu-compile]'")
    return backend
