"""The few constants of the speed prediction (evaluator/performance/prediction.py), fitted to real
TPU timings, and the file they are read from.

Fitted by `python -m evaluator calibrate` (evaluator/performance/fit.py) on JAXBench's measured v6e
times of its benchmark workloads and GPT-5.3's kernels (benchmarks/perf_agreement.py); Gemini 3's
kernels are held out. A generation timed on a chip of its own has a file of its own
(`calibration-compiled-v5e.json`: the kernel side fitted to benchmarks/grid_step_cost.py's
kernels, the rest to GPT-5.3's kernels timed again on a v5e); the others read the v6e fit. A
TPU user refits them from their own timings into a file of their own and points
`PALLAS_KERNEL_GYM_CALIBRATION` at it. The verdict cache keys on them (evaluator/grader.py).

These constants move predictions only. The work rules of the estimate stage keep the unfitted
model of evaluator/performance/perf_model.py, so a refit never changes a verdict's status.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILE = Path(__file__).with_name("calibration.json")
# Fitted where libtpu compiled each candidate and XLA's cost model priced its glue
# (prediction.glue_time): that glue is priced differently, so its constants are fitted apart.
COMPILED_FILE = Path(__file__).with_name("calibration-compiled.json")
MIN_CALL_S = 1e-7  # no program takes less on the device: a prediction never divides by zero
ENV = "PALLAS_KERNEL_GYM_CALIBRATION"


@dataclass(frozen=True)
class Calibration:
    """What the roofline leaves out, one number each (docs/performance-model.md)."""

    grid_step_s: float = 0.35e-6      # fixed cost of one Pallas grid step
    f32_matmul_share: float = 1 / 3   # f32-operand matmul rate in a kernel, as a share of the bf16 peak
    hbm_efficiency: float = 1.0       # share of the published HBM bandwidth a kernel's DMAs reach
    compute_efficiency: float = 1.0   # share of the peak FLOP rate a kernel's arithmetic reaches
    xla_efficiency: float = 1.0       # XLA's cost-model time over the time XLA's program takes
    conv_efficiency: float = 1.0      # share of the peak a convolution's MXU-padded FLOPs reach
    loop_iteration_s: float = 0.0     # fixed cost of one iteration of a loop XLA runs (scan, while)
    # Host cost of one timed call, added to kernel and XLA alike: our timing stage and JAXBench's
    # harness time calls by the wall clock (a device profiler would not see it).
    dispatch_s: float = 0.0
    # The vector units' rate for a kernel's work other than dots (elementwise, transcendental,
    # reductions), measured by a chip's microbenchmarks (benchmarks/grid_step_cost.py fit); 0
    # where none were: that work runs at the MXU's calibrated rate, as the model had it before.
    vector_flops_per_s: float = 0.0
    fitted_on: str = "not fitted: the model's assumptions"

    def to_dict(self) -> dict[str, float | str]:
        return dataclasses.asdict(self)


def generation_file(compiled: bool, generation: str) -> Path:
    """Where a generation's own constants for a path are kept (`compiled`: predictions whose glue
    XLA priced from a libtpu compile)."""
    default = COMPILED_FILE if compiled else DEFAULT_FILE
    return default.with_name(f"{default.stem}-{generation}.json")


def committed_file(compiled: bool = False, generation: str | None = None) -> Path:
    """The committed constants for a path and a generation: its own file where one was fitted
    to its times, else the v6e fit."""
    own = generation_file(compiled, generation) if generation else None
    return own if own and own.exists() else (COMPILED_FILE if compiled else DEFAULT_FILE)


def load(path: str | Path | None = None, compiled: bool = False, generation: str | None = None) -> Calibration:
    """The constants from `path`, else from $PALLAS_KERNEL_GYM_CALIBRATION, else the committed
    file (`committed_file`)."""
    path = Path(path or os.environ.get(ENV) or committed_file(compiled, generation))
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"calibration file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"calibration file {path} is not JSON: {exc}") from None
    known = {f.name for f in dataclasses.fields(Calibration)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"calibration file {path} has unknown constants {sorted(unknown)}")
    return Calibration(**data)


def save(calibration: Calibration, path: str | Path) -> None:
    Path(path).write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
