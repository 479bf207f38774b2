"""Pallas stand-ins for the XLA ops real attempts leave outside their kernels.

A JAXBench attempt that calls `jax.lax.conv_general_dilated`, `jax.lax.conv_transpose`,
`jnp.matmul` or `jnp.dot` around its own Pallas epilogue does the task's heavy work in XLA, and
our grader refuses it (`work_outside_kernel`). The `work_outside` repairer
(data_gen/repairs/repairers.py) replaces each such call by one of the functions below, with the
same signature and semantics, and appends this module's code to the attempt: candidates are
self-contained, so the code travels as text.

All of them do their multiply-adds in one blocked Pallas matmul with a float32 accumulator in
VMEM and a grid axis over batch elements. The convolution is lowered the way TPU convolutions are
written by hand: the input is padded and dilated (glue), each kernel tap's strided window is
sliced out (glue: data movement, no arithmetic), and the matmul runs over (taps x input
channels), one per feature group. tests/test_pallas_ops.py checks each function against XLA's
over the arguments real attempts pass (strides, dilations, paddings, groups, 1-3 spatial dims,
layouts; batched and folded matmuls).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Largest blocks (rows, output features, taps x channels): the contraction usually fits one K
# block (a 3x3 kernel over 64 channels is 576), so the patches are read once per N block; with
# float32 operands the double-buffered blocks and the accumulator take 13 MiB of VMEM, under the
# smallest default scoped limit (16 MiB, v5e), and interpret mode runs few grid steps.
_VERIFIED_BLOCK_M = 1024
_VERIFIED_BLOCK_N = 256
_VERIFIED_BLOCK_K = 1024


def _verified_matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(3) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(3) == pl.num_programs(3) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _verified_block(size, largest):
    """(block, padded size) along one dim: the whole dim when it fits one block (a block equal to
    the array's dim is always legal, and nothing is padded), else `largest`-sized blocks over the
    dim padded to a multiple of them."""
    if size <= largest:
        return size, size
    return largest, (size + largest - 1) // largest * largest


def _verified_matmul(a, b, out_dtype):
    """a[M, K] @ b[K, N] in a Pallas kernel, float32 accumulation (_verified_batched_matmul)."""
    return _verified_batched_matmul(a[None], b[None], out_dtype)[0]


def _verified_batched_matmul(a, b, out_dtype):
    """a[B, M, K] @ b[B, K, N] in a Pallas kernel, one product per batch element (a grid axis),
    float32 accumulation. A dim larger than one block is zero-padded to whole blocks (zeros add
    nothing to the sums) and the result cropped; small dims are not padded, so the product that
    leaves the kernel is no larger than the result."""
    batch, m, k = a.shape
    n = b.shape[2]
    bm, mp = _verified_block(m, _VERIFIED_BLOCK_M)
    bn, np_ = _verified_block(n, _VERIFIED_BLOCK_N)
    bk, kp = _verified_block(k, _VERIFIED_BLOCK_K)
    if (mp, kp) != (m, k):
        a = jnp.pad(a, ((0, 0), (0, mp - m), (0, kp - k)))
    if (kp, np_) != (k, n):
        b = jnp.pad(b, ((0, 0), (0, kp - k), (0, np_ - n)))
    out = pl.pallas_call(
        _verified_matmul_kernel,
        grid=(batch, mp // bm, np_ // bn, kp // bk),
        in_specs=[pl.BlockSpec((None, bm, bk), lambda g, i, j, kk: (g, i, kk)),
                  pl.BlockSpec((None, bk, bn), lambda g, i, j, kk: (g, kk, j))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda g, i, j, kk: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, mp, np_), out_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(a, b)
    return out if (mp, np_) == (m, n) else out[:, :m, :n]


def _verified_conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                                   dimension_numbers=None, feature_group_count=1, batch_group_count=1,
                                   precision=None, preferred_element_type=None):
    """`jax.lax.conv_general_dilated`, its multiply-adds in a Pallas matmul (module docstring)."""
    if batch_group_count != 1:
        raise NotImplementedError("batch_group_count > 1")
    spatial = lhs.ndim - 2
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    lhs_dilation = tuple(lhs_dilation or (1,) * spatial)
    rhs_dilation = tuple(rhs_dilation or (1,) * spatial)
    window_strides = tuple(window_strides)
    # channels last: x[N, *spatial, C], w[*taps, C / groups, O]
    x = jnp.transpose(lhs, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1]))
    w = jnp.transpose(rhs, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0]))
    taps = w.shape[:spatial]
    reach = [(t - 1) * d + 1 for t, d in zip(taps, rhs_dilation)]
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(x.shape[1:-1], reach, window_strides, padding)
    config = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation)] + [(0, 0, 0)]
    x = lax.pad(x, jnp.zeros((), x.dtype), config)
    out_sizes = [(size - r) // s + 1 for size, r, s in zip(x.shape[1:-1], reach, window_strides)]
    windows = []
    for tap in _verified_taps(taps):
        start = [0] + [t * d for t, d in zip(tap, rhs_dilation)] + [0]
        limit = ([x.shape[0]] + [b + (o - 1) * s + 1 for b, o, s in zip(start[1:-1], out_sizes, window_strides)]
                 + [x.shape[-1]])
        windows.append(lax.slice(x, start, limit, (1, *window_strides, 1)))
    groups = feature_group_count
    batch, channels, out_features = x.shape[0], x.shape[-1], w.shape[-1]
    rows = batch * math.prod(out_sizes)
    n_taps = len(windows)
    per_group, out_per_group = channels // groups, out_features // groups
    patches = jnp.stack(windows, axis=-2).reshape(rows, n_taps, groups, per_group)
    w = w.reshape(n_taps, per_group, groups, out_per_group)
    out_dtype = preferred_element_type or lhs.dtype
    parts = [_verified_matmul(patches[:, :, g, :].reshape(rows, n_taps * per_group),
                              w[:, :, g, :].reshape(n_taps * per_group, out_per_group), out_dtype)
             for g in range(groups)]
    out = jnp.concatenate(parts, axis=-1).reshape(batch, *out_sizes, out_features)
    # back to the requested output layout
    order = [0] * lhs.ndim
    order[dn.out_spec[0]] = 0
    order[dn.out_spec[1]] = lhs.ndim - 1
    for i, axis in enumerate(dn.out_spec[2:]):
        order[axis] = 1 + i
    return jnp.transpose(out, order)


def _verified_taps(sizes):
    """Every kernel tap's index tuple, the last index fastest (the order of w's taps)."""
    indices = [()]
    for size in sizes:
        indices = [i + (t,) for i in indices for t in range(size)]
    return indices


def _verified_transpose_padding(k, s, padding):
    """Before and after padding of one dim of a transposed convolution, from the forward conv's
    padding ('SAME', 'VALID', or a (lo, hi) pair), as jax.lax.conv_transpose defines it."""
    if padding == "SAME":
        total = k + s - 2
        before = k - 1 if s > k - 1 else -(-total // 2)
    elif padding == "VALID":
        total = k + s - 2 + max(k - s, 0)
        before = k - 1
    else:
        before, after = (k - p - 1 for p in padding)
        total = before + after
    return before, total - before


def _verified_conv_transpose(lhs, rhs, strides, padding, rhs_dilation=None, dimension_numbers=None,
                             transpose_kernel=False, precision=None, preferred_element_type=None,
                             use_consistent_padding=False):
    """`jax.lax.conv_transpose`: a convolution of the input dilated by the strides, with the
    paddings jax derives, through _verified_conv_general_dilated."""
    spatial = lhs.ndim - 2
    if dimension_numbers is None:
        letters = "HWD"[:spatial] if spatial <= 3 else None
        if letters is None:
            raise ValueError("No 4+ dimensional dimension_number defaults.")
        dimension_numbers = (f"N{letters}C", f"{letters}IO", f"N{letters}C")
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    rhs_dilation = tuple(rhs_dilation or (1,) * spatial)
    taps = [rhs.shape[axis] for axis in dn.rhs_spec[2:]]
    if use_consistent_padding or (isinstance(padding, str) and padding in ("SAME", "VALID")):
        per_dim = [padding] * spatial if isinstance(padding, str) else list(padding)
        pads = [_verified_transpose_padding((k - 1) * d + 1, s, tuple(p) if not isinstance(p, str) else p)
                for k, d, s, p in zip(taps, rhs_dilation, strides, per_dim)]
    else:
        pads = padding
    if transpose_kernel:
        for axis in dn.rhs_spec[2:]:
            rhs = jnp.flip(rhs, axis)
        rhs = jnp.swapaxes(rhs, dn.rhs_spec[0], dn.rhs_spec[1])
    return _verified_conv_general_dilated(lhs, rhs, (1,) * spatial, pads, tuple(strides), rhs_dilation, dn,
                                          precision=precision, preferred_element_type=preferred_element_type)


def _verified_jnp_matmul(a, b, precision=None, preferred_element_type=None):
    """`jnp.matmul` for the operands attempts pass: a[..., M, K] @ b[K, N] (a's leading dims
    folded into rows) or, with the same batch dims on both, one product per batch element."""
    out_dtype = preferred_element_type or jnp.result_type(a, b)
    if a.ndim >= 2 and b.ndim == 2:
        out = _verified_matmul(a.reshape(-1, a.shape[-1]), b, out_dtype)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    if a.ndim == b.ndim >= 3 and a.shape[:-2] == b.shape[:-2]:
        out = _verified_batched_matmul(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    raise NotImplementedError(f"matmul of shapes {a.shape} and {b.shape}")


def _verified_jnp_dot(a, b, precision=None, preferred_element_type=None):
    """`jnp.dot` where it is a matmul: b two-dimensional (with more dims on b, dot is not a
    batched product)."""
    if b.ndim != 2:
        raise NotImplementedError(f"dot of shapes {a.shape} and {b.shape}")
    return _verified_jnp_matmul(a, b, precision, preferred_element_type)


# what the repairer substitutes: the XLA call's dotted names -> the stand-in's name
STAND_INS = {
    "jnp.matmul": "_verified_jnp_matmul",
    "jax.numpy.matmul": "_verified_jnp_matmul",
    "jnp.dot": "_verified_jnp_dot",
    "jax.numpy.dot": "_verified_jnp_dot",
    "jax.lax.conv_general_dilated": "_verified_conv_general_dilated",
    "lax.conv_general_dilated": "_verified_conv_general_dilated",
    "jax.lax.conv_transpose": "_verified_conv_transpose",
    "lax.conv_transpose": "_verified_conv_transpose",
}
