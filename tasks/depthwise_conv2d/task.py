"""depthwise_conv2d: a depthwise 2-D convolution of NHWC activations, stride 1, SAME padding.

Every channel c is filtered on its own by its k x k filter w[:, :, c]:

    out[n, y, x, c] = sum_{i < k, j < k} xpad[n, y + i, x + j, c] * w[i, j, c]

where xpad is x with (k - 1) // 2 zero rows above and k // 2 below, (k - 1) // 2 zero columns
to the left and k // 2 to the right (lax's "SAME": the output keeps the input's height and
width). It is a cross-correlation, as every deep learning framework's conv is: the filter is
not flipped. Computed in float32; output in x.dtype. The reference is
lax.conv_general_dilated with feature_group_count = c (weights [k, k, 1, c], HWIO) at HIGHEST
precision. A real kernel is k * k multiply-adds per element on the vector unit, over data
that crosses HBM once: memory bound.

Shapes from the models that run it (224x224 input unless said):
- MobileNetV2 (Sandler et al. 2018; torchvision mobilenet_v2, inverted residual settings
  t, c, n, s = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
  (6, 160, 3, 2), (6, 320, 1, 1)): the 3x3 depthwise of an inverted residual runs on the
  expanded channels, t * c_in. Stride 1 ones: 32 channels at 112x112 (the first block,
  t = 1), 144 at 56x56 (24 * 6, the c = 24 stage's second block), 192 at 28x28, 384 and 576
  at 14x14, 960 at 7x7. (112x112x96 is the input of the c = 24 stage's first depthwise, which
  has stride 2.) The 112x112x32 and 56x56x144 ones at batch 32 are train bench cases; the
  same network in SSD (TF Object Detection API ssd_mobilenet_v2_coco: a 300x300 input, batch
  24) runs the 144-channel depthwise at 75x75, a spatial size off the 8-row tile: held-out
  bench.
- ConvNeXt-T (Liu et al. 2022; depths (3, 3, 9, 3), dims (96, 192, 384, 768), a 7x7
  depthwise conv, padding 3, first in every block): 96 channels at 56x56 and 384 at 14x14, at
  batch 32: train bench cases.
- EfficientNet-B0 (Tan and Le 2019): MBConv6 blocks with 5x5 depthwise convs, 40 * 6 = 240
  channels at 28x28 (stage 4's stride-1 block): the held-out bench (batch 32); and 112 * 6 = 672
  channels, there at 14x14, here at 7x7 for a held-out check size (14x14 is a train check
  size, and a 5x5 window over 7x7 is mostly halo).
Check sizes keep the channel counts: the train ones span several row blocks of the solution
(one with 7x7 filters, so a halo of three rows on each side), one of them ragged (181 rows,
62 columns, MobileNetV2's 144 channels), and several 14x14 images in one block; held-out ones
use 5x5 filters, batch 1 and channels off the 128-lane tile.
Shapes from: MobileNetV2, ConvNeXt-T, EfficientNet-B0.
"""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax import lax

from tasks.spec import ArgSpec, Case, Task, case_grid, normal

_DTYPES = ("float32", "bfloat16")


def reference(x, w):
    k1, k2, c = w.shape
    out = lax.conv_general_dilated(x, w.reshape(k1, k2, 1, c), window_strides=(1, 1),
                                   padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                   feature_group_count=c, precision=lax.Precision.HIGHEST,
                                   preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def arg_specs(case: Case) -> list[ArgSpec]:
    d = case.dims
    return [ArgSpec((d["n"], d["h"], d["w"], d["c"]), case.dtype),
            ArgSpec((d["k"], d["k"], d["c"]), case.dtype)]


def out_specs(case: Case) -> list[ArgSpec]:
    return arg_specs(case)[:1]


def make_inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    x_spec, w_spec = arg_specs(case)
    # Filter taps of scale 1/k (fan-in k * k for a depthwise conv) keep outputs O(1).
    return (normal(rng, x_spec.shape, case.dtype),
            normal(rng, w_spec.shape, case.dtype, scale=1.0 / case.dims["k"]))


CASES = (
    # Train: two row blocks of 68 rows (float32) with ConvNeXt's 7x7 filter; a ragged 3x3 one
    # (181 rows in blocks of 61, 61, 59, or 91, 90 in bfloat16; 62 columns, 144 channels); three
    # 14x14 images, two per block.
    case_grid("train", "check", [dict(n=1, h=136, w=64, c=128, k=7),
                                 dict(n=1, h=181, w=62, c=144, k=3),
                                 dict(n=3, h=14, w=14, c=384, k=7)], _DTYPES)
    # Held-out: EfficientNet-B0's 5x5 over 672 channels (off the lane tile) on 7x7 images; batch 1
    # with 100 channels over two row blocks of a size no train case has.
    + case_grid("heldout", "check", [dict(n=2, h=7, w=7, c=672, k=5),
                                     dict(n=1, h=150, w=77, c=100, k=3)], _DTYPES)
    # MobileNetV2's stride-1 depthwise at 112x112x32 and 56x56x144; ConvNeXt-T's 7x7 at
    # 56x56x96 and 14x14x384; batch 32.
    + case_grid("train", "bench", [dict(n=32, h=112, w=112, c=32, k=3),
                                   dict(n=32, h=56, w=56, c=144, k=3),
                                   dict(n=32, h=56, w=56, c=96, k=7),
                                   dict(n=32, h=14, w=14, c=384, k=7)], _DTYPES)
    # EfficientNet-B0's 5x5 at 28x28x240 (batch 32); SSD-MobileNetV2's 75x75x144 (batch 24).
    + case_grid("heldout", "bench", [dict(n=32, h=28, w=28, c=240, k=5),
                                     dict(n=24, h=75, w=75, c=144, k=3)], _DTYPES)
)

TASK = Task(
    name="depthwise_conv2d",
    version=1,
    level=1,
    description=("Depthwise 2-D convolution (cross-correlation, one k x k filter per channel) of NHWC "
                 "activations, stride 1, SAME padding ((k-1)//2 rows above, k//2 below; likewise "
                 "columns), computed in float32; output in x.dtype."),
    signature="kernel(x[n, h, w, c], w[k, k, c]) -> [n, h, w, c]",
    reference=reference,
    arg_specs=arg_specs,
    make_inputs=make_inputs,
    out_specs=out_specs,
    cases=tuple(CASES),
    solution_path=Path(__file__).with_name("solution.py"),
    required_features=("parallel_grid",),
)
