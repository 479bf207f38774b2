"""Stand-ins, written with ops Mosaic lowers, for jnp ops inside a kernel that it does not.

A JAXBench attempt whose kernel calls `jnp.cumsum` fails to lower for TPU (Mosaic has no rule for
the cumulative sum), however right the rest is. The `unsupported_op` repairer
(data_gen/repairs/repairers.py) replaces such a call by the function below, same arguments, and
appends this module's code to the attempt, as the work_outside repairer does with
data_gen/repairs/pallas_ops.py.

The cumulative sum along a row is a blocked scan in two matmuls (the MXU does the adds): the
row is cut into 128-lane chunks, laid as the rows of a (chunks, 128) matrix; their running sums
are one matmul by a triangular matrix of ones, and what each chunk adds, the totals of the
chunks before it (after it, for the sums from the end), is a second one (a strictly triangular
matrix times the chunks' last sums). The rows of a block are taken one at a time (a Python
loop, unrolled when the kernel is traced): Mosaic reshapes a row into chunks, but not a block's
chunk totals back into rows. Down the rows of a block it is one matmul from the left.
tests/test_kernel_ops.py checks it against jnp.cumsum inside a Pallas kernel.
"""
import jax.numpy as jnp
from jax import lax

_VERIFIED_SCAN_CHUNK = 128  # lanes per chunk: one vreg row, and the triangular matrix a 128x128 tile
_VERIFIED_SCAN_MAX_CHUNK = 512  # a row that is no multiple of 128 is one chunk, at most this long
_VERIFIED_SCAN_MAX_CHUNKS = 1024  # chunks per row (a row of 131,072 lanes): the carry's matrix is 4 MiB


def _verified_triangle(size, inclusive, reverse):
    """A (size, size) float32 matrix of ones where row i feeds column j of a running sum: i <= j
    (from the start) or i >= j (from the end); strict without `inclusive`."""
    rows = lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = lax.broadcasted_iota(jnp.int32, (size, size), 1)
    if reverse:
        keep = rows >= cols if inclusive else rows > cols
    else:
        keep = rows <= cols if inclusive else rows < cols
    return jnp.where(keep, 1.0, 0.0).astype(jnp.float32)


def _verified_cumsum(x, axis=None, dtype=None, reverse=False):
    """jnp.cumsum(x, axis) inside a Pallas TPU kernel, along an axis of a block of rank 2 or more
    (`reverse`: the sums from the end, as jnp.flip around jnp.cumsum gives them); down the rows
    of a 2-D block of up to 512 rows it is one matmul, along any other axis than the last the
    axis is swapped to the end and back. Anything else raises: a repair that cannot
    compute the same thing must fail its grading."""
    if axis is None or x.ndim < 2:
        raise NotImplementedError("_verified_cumsum: only along an axis of a block of rank 2 or more")
    axis %= x.ndim
    if axis == 0 and x.ndim == 2 and x.shape[0] <= _VERIFIED_SCAN_MAX_CHUNK:
        # down the rows of a block: one matmul from the left, row j summing rows i <= j (i >= j)
        return jnp.dot(_verified_triangle(x.shape[0], True, not reverse), x.astype(jnp.float32),
                       preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST).astype(dtype or x.dtype)
    if axis != x.ndim - 1:
        return jnp.swapaxes(_verified_cumsum(jnp.swapaxes(x, axis, -1), -1, dtype, reverse), axis, -1)
    n = x.shape[-1]
    chunk = _VERIFIED_SCAN_CHUNK if n % _VERIFIED_SCAN_CHUNK == 0 else n
    if chunk > _VERIFIED_SCAN_MAX_CHUNK or n // chunk > _VERIFIED_SCAN_MAX_CHUNKS:
        raise NotImplementedError(f"_verified_cumsum: no blocked scan for a row of {n} lanes")
    chunks = n // chunk
    within = _verified_triangle(chunk, True, reverse)
    before = _verified_triangle(chunks, False, not reverse) if chunks > 1 else None
    rows = x.astype(jnp.float32).reshape(-1, n)
    out = []
    for r in range(rows.shape[0]):
        # one row as (chunks, chunk): each chunk's running sums in one matmul ...
        local = jnp.dot(rows[r:r + 1, :].reshape(chunks, chunk), within, preferred_element_type=jnp.float32,
                        precision=lax.Precision.HIGHEST)
        if before is not None:
            # ... plus the totals of the chunks before it (after it, reversed) in another
            edge = local[:, :1] if reverse else local[:, chunk - 1:]
            local = local + jnp.dot(before, edge, preferred_element_type=jnp.float32,
                                    precision=lax.Precision.HIGHEST)
        out.append(local.reshape(1, n))
    joined = out[0] if len(out) == 1 else jnp.concatenate(out, axis=0)
    return joined.reshape(x.shape).astype(dtype or x.dtype)


STAND_INS = {"jnp.cumsum": "_verified_cumsum", "jax.numpy.cumsum": "_verified_cumsum"}
