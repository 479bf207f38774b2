"""Depthwise 2-D SAME convolution on the vector unit, over row blocks whose halo rows are
fetched beside them.

Grid (image blocks, row blocks, channel blocks), all "parallel": a step filters `bh` rows of
`nb` images (whole images, several per step, when an image is smaller than the block; else
one image in blocks of rows) for one block of channels. Output row y reads input rows
y - ph .. y + pb (ph = (k - 1) // 2 above, pb = k // 2 below), so besides its own rows a block
needs the ph rows just above it and the pb rows just below: each halo row is an operand of its
own, x again with a one-row block whose index map points at that row (clamped into the
image; the kernel zeroes a halo row that lies outside it, which is the SAME padding). Every
element of x crosses HBM once, plus k - 1 rows per row block; blocks of whole images take no
halo operands (their halo rows are all padding).

In VMEM the kernel assembles a float32 buffer `xs` [nb, bh + k - 1, cols, bc]: the ph halo
rows, the block's rows, the pb halo rows, each row stored from column c0 (pw = (k - 1) // 2
rounded up to the 8-row sublane tile, so the store is aligned) with zero columns before and
after it. A row block that overhangs the image (a ragged height) zeroes its rows past the end
first: the last real output row reads pb of them as padding. A loop then walks chunks of `rb`
output rows: for each column tap j it loads the chunk's rb + k - 1 input rows shifted by
j - pw columns (xs[b, y0:y0 + rb + k - 1, c0 - pw + j : ... + w, :], the load doing the
sublane shift), and the k row taps w[i, j] * rows[i:i + rb] are slices of that load; the
k * k products sum in float32 and the chunk is stored. The last chunk of a block starts early
enough to end at the block's end (it may recompute rows of the one before).

Block sizes: the kernel is memory bound and a step costs a fixed overhead, so a block holds
up to BLOCK_X = 4 MiB of x (lanes padded to 128): a whole 56x56x144 image in float32, two in
bfloat16, 16 images of 14x14x384, at most half the batch so that two cores have a block each.
The row loop sums about ACC_VREGS vregs of output at a time, so its sums stay in registers.
Channels are one block up to BLOCK_C, else split in equal 128-multiples.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_X = 4 << 20  # tune: 1048576, 2097152, 4194304, 8388608  (bytes of x per step, at most)
BLOCK_C = 1024     # tune: 512, 1024, 2048  (channels per block, a multiple of 128)
ACC_VREGS = 32     # tune: 16, 32, 64  (float32 vregs of output rows summed per loop step)
_MIB = 1 << 20


def _round_up(x, m):
    return (x + m - 1) // m * m


def _block(dim, preferred):
    """The whole dim if it is no larger than the preferred size (a multiple of 128); else the
    dim split into that many equal-as-possible blocks, each rounded up to 128."""
    if dim <= preferred:
        return dim
    return _round_up(pl.cdiv(dim, pl.cdiv(dim, preferred)), 128)


def _tiles(n, h, w, pixels):
    """(images, rows) per block of at most `pixels` pixels: whole images while one fits (at
    most half the batch; a divisor of n if one is at least half that many, else equal-as-possible
    blocks), else equal-as-possible blocks of rows of one image."""
    if h * w <= pixels:
        nb = max(1, min(pl.cdiv(n, 2), pixels // (h * w)))
        divisors = [d for d in range(nb, (nb - 1) // 2, -1) if n % d == 0]
        return (divisors[0] if divisors else pl.cdiv(n, pl.cdiv(n, nb))), h
    bh = max(1, pixels // w)
    return 1, pl.cdiv(h, pl.cdiv(h, bh))


def dw_kernel(*refs, n_top, n_bottom, halo, height, c0):
    n_halo = n_top + n_bottom if halo else 0
    x_ref, halo_refs = refs[0], refs[1:1 + n_halo]
    w_ref, o_ref, xs_ref = refs[1 + n_halo:]
    nb, bh, width, bc = x_ref.shape
    k = w_ref.shape[0]
    pw = (k - 1) // 2
    rows, cols = xs_ref.shape[1:3]
    row0 = pl.program_id(1) * bh

    # Zero columns around the image (the left and right padding).
    if c0:
        xs_ref[:, :, 0:c0, :] = jnp.zeros((nb, rows, c0, bc), jnp.float32)
    tail = (c0 + width) // 8 * 8
    if tail < cols:
        xs_ref[:, :, tail:cols, :] = jnp.zeros((nb, rows, cols - tail, bc), jnp.float32)
    xb = x_ref[...].astype(jnp.float32)
    if height % bh:  # static: the last row block overhangs the image
        row = row0 + lax.broadcasted_iota(jnp.int32, xb.shape, 1)
        xb = jnp.where(row < height, xb, 0.0)
    xs_ref[:, n_top:n_top + bh, c0:c0 + width, :] = xb
    if not halo:  # static: whole images, whose halo rows are all padding
        if n_top:
            xs_ref[:, 0:n_top, :, :] = jnp.zeros((nb, n_top, cols, xs_ref.shape[3]), jnp.float32)
        if n_bottom:
            xs_ref[:, n_top + bh:rows, :, :] = jnp.zeros((nb, n_bottom, cols, xs_ref.shape[3]),
                                                         jnp.float32)
    for t, ref in enumerate(halo_refs):
        if t < n_top:
            row, slot = row0 - n_top + t, t
        else:
            row, slot = row0 + bh + t - n_top, bh + t
        inside = (row >= 0) & (row < height)
        xs_ref[:, slot, c0:c0 + width, :] = jnp.where(inside, ref[...].astype(jnp.float32), 0.0)

    w = w_ref[...].astype(jnp.float32)                      # [k, k, bc]
    rb = min(bh, max(1, ACC_VREGS // (pl.cdiv(width, 8) * pl.cdiv(bc, 128))))
    chunks = pl.cdiv(bh, rb)

    def out_rows(t, carry):
        # Output rows y0 .. y0 + rb - 1 of image b; the last chunk of a block ends at its end
        # (it may recompute rows of the one before).
        b, y0 = t // chunks, jnp.minimum((t % chunks) * rb, bh - rb)
        acc = jnp.zeros((rb, width, bc), jnp.float32)
        for j in range(k):                                  # static: k is a shape
            # The rows the chunk reads, shifted by j - pw columns: one load per column tap.
            slab = xs_ref[b, pl.ds(y0, rb + k - 1), pl.ds(c0 - pw + j, width), :]
            for i in range(k):
                acc = acc + w[i, j:j + 1, :] * slab[i:i + rb]
        o_ref[b, pl.ds(y0, rb)] = acc.astype(o_ref.dtype)
        return carry

    lax.fori_loop(0, nb * chunks, out_rows, 0)


@functools.partial(jax.jit, static_argnames=("nb", "bh", "bc"))
def _conv(x, w, *, nb, bh, bc):
    n, height, width, c = x.shape
    k = w.shape[0]
    n_top, n_bottom = (k - 1) // 2, k // 2
    pw = (k - 1) // 2
    c0 = _round_up(pw, 8)
    cols = _round_up(c0 - pw + k - 1 + width, 8)

    def halo_spec(offset):
        """One row of x, `offset` rows from the block's first row, clamped into the image."""
        return pl.BlockSpec((nb, None, width, bc),
                            lambda b, r, cb: (b, jnp.clip(r * bh + offset, 0, height - 1), 0, cb))

    # Whole images need no halo rows: theirs are all padding.
    halo = bh < height
    halos = ([halo_spec(t - n_top) for t in range(n_top)]
             + [halo_spec(bh + t) for t in range(n_bottom)]) if halo else []
    isz = x.dtype.itemsize
    lanes, w8 = _round_up(bc, 128), _round_up(width, 8)
    blocks = (2 * nb * bh + (k - 1) * nb) * w8 * lanes * isz + k * _round_up(k, 8) * lanes * isz
    need = 2 * blocks + nb * (bh + k - 1) * cols * lanes * 4 + 2 * nb * bh * w8 * lanes * 4
    return pl.pallas_call(
        functools.partial(dw_kernel, n_top=n_top, n_bottom=n_bottom, halo=halo, height=height,
                          c0=c0),
        grid=(pl.cdiv(n, nb), pl.cdiv(height, bh), pl.cdiv(c, bc)),
        in_specs=[pl.BlockSpec((nb, bh, width, bc), lambda b, r, cb: (b, r, 0, cb)), *halos,
                  pl.BlockSpec((k, k, bc), lambda b, r, cb: (0, 0, cb))],
        out_specs=pl.BlockSpec((nb, bh, width, bc), lambda b, r, cb: (b, r, 0, cb)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((nb, bh + k - 1, cols, bc), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            vmem_limit_bytes=int(min(max(need + 8 * _MIB, 32 * _MIB), 100 * _MIB))),
    )(x, *([x] * len(halos)), w)


def kernel(x, w):
    n, height, width, c = x.shape
    if w.shape[1:] != (w.shape[0], c):
        raise ValueError(f"shape mismatch: {x.shape=} {w.shape=}")
    bc = _block(c, BLOCK_C)
    nb, bh = _tiles(n, height, width, max(1, BLOCK_X // (_round_up(bc, 128) * x.dtype.itemsize)))
    return _conv(x, w, nb=nb, bh=bh, bc=bc)
