"""A third-party kernel corpus: the Pallas TPU kernels that ship inside jax, as candidates.

Each entry turns one of jax's own kernels (`jax/experimental/pallas/ops/tpu/...`) into a
single-file candidate for one of our tasks: the kernel module's source text, read from the
*installed* jax package at test time, followed by a small wrapper of ours that defines
`kernel(...)` with the task's signature (block sizes picked from the shapes, padding, the
softmax scale, the layout changes a task needs).

Nothing of jax's source is committed to this repository: the wrappers below are ours, the
kernels are read from site-packages when `build_source` runs. That keeps jax's code under its
own licence and copyright (Apache-2.0, The JAX Authors) and, just as important, keeps the
corpus in step with the jax the grader runs: a jax upgrade re-tests the new kernels.

Why inline at all, instead of `from jax.experimental.pallas.ops.tpu import flash_attention`?
The grader requires the kernel bodies (the functions handed to pallas_call) to be defined in
the candidate's own text (evaluator/analysis/provenance.py): a library's kernel is not the candidate's
work. So the kernel module is inlined; library helper modules that are not kernels (splash
attention's mask builders and mask-info processing, megablox's `common`, paged attention's
`quantization_utils`) stay ordinary imports.

The inlined text is changed only by the mechanical rewrites listed in `_REWRITES_ALWAYS` and
in each entry's `rewrites`, each with its reason; a rewrite whose text is not found raises, so
a jax upgrade that moves things is noticed rather than silently graded differently.
"""
from __future__ import annotations

import importlib.util
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rewrite:
    """Replace `old` by `new` in an inlined module (every occurrence). A `required` rewrite
    whose `old` text is missing raises: the installed jax changed under it."""

    old: str
    new: str
    reason: str
    required: bool = True
    module: str = ""  # only in this one of an entry's source_modules (default: in every one)


@dataclass(frozen=True)
class ThirdPartyKernel:
    """One corpus entry: jax kernel module(s) + our wrapper -> a candidate for `task`."""

    name: str
    task: str
    source_modules: tuple[str, ...]  # paths under `root`, inlined in order
    wrapper: str  # our code, appended after the inlined modules; defines kernel(...)
    splits_expected_correct: tuple[str, ...]  # graded `correct` on these splits...
    dtypes_expected_correct: tuple[str, ...] = ("float32", "bfloat16")  # ...on these dtypes' cases
    expected_failures: tuple[tuple[str, str], ...] = ()  # (split, status) the grader must give
    note: str = ""  # why a split or dtype is not expected correct
    rewrites: tuple[Rewrite, ...] = ()  # applied to every inlined module, after _REWRITES_ALWAYS
    # Where source_modules live: a folder path that starts with its top-level package's name,
    # found by `source_dir` (jax's pallas/ops/tpu unless an entry names another package).
    root: str = "jax/experimental/pallas/ops/tpu"

    def expected_correct(self, split: str, dtype: str) -> bool:
        """Whether the grader must grade this kernel's cases of `split` and `dtype` correct."""
        return split in self.splits_expected_correct and dtype in self.dtypes_expected_correct


# Applied to every inlined module. No `jax._src` import needs rewriting with jax 0.10: none of
# the inlined modules imports it (splash_attention_mask_info.py does, but it stays an import,
# and the policy reads only the candidate's text). An entry whose module did would list a
# Rewrite to the public equivalent here or in its `rewrites`, with the reason.
_REWRITES_ALWAYS = (
    Rewrite("from __future__ import annotations\n", "",
            "a __future__ import must be the first statement of a file; build_source puts one "
            "at the top of the candidate instead", required=False),
)

PALLAS_TPU_OPS = "jax/experimental/pallas/ops/tpu"

# Folders, separated by os.pathsep, that hold unpacked wheels (each folder has the package
# folder and its *.dist-info side by side, as `unzip x.whl -d FOLDER` leaves them): where a
# corpus of kernels from a package that is not installed (tests/thirdparty_pypi.py) is read.
WHEELS_ENV = "PALLAS_KERNEL_GYM_WHEELS"


class SourceUnavailable(RuntimeError):
    """An entry's package is neither installed nor in $PALLAS_KERNEL_GYM_WHEELS."""


def ops_dir() -> Path:
    """The installed jax's pallas/ops/tpu folder (located, never imported from this repo)."""
    spec = importlib.util.find_spec("jax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("jax is not installed")
    return Path(list(spec.submodule_search_locations)[0]).parent / PALLAS_TPU_OPS


def _package_parent(package: str) -> Path:
    """The folder holding `package`: an installed one (located, not imported), else the first
    unpacked wheel in $PALLAS_KERNEL_GYM_WHEELS that has it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    for folder in filter(None, os.environ.get(WHEELS_ENV, "").split(os.pathsep)):
        if (Path(folder) / package).is_dir():
            return Path(folder)
    raise SourceUnavailable(f"{package} is not installed, nor in ${WHEELS_ENV} "
                            f"({os.environ.get(WHEELS_ENV, 'unset')}): pip download --no-deps it "
                            f"and unzip the wheel into a folder named there")


def source_dir(root: str) -> Path:
    """The folder an entry's `root` names (jax's pallas/ops/tpu is found as it always was)."""
    if root == PALLAS_TPU_OPS:
        return ops_dir()
    return _package_parent(root.split("/")[0]) / root


def package_version(package: str) -> str:
    """The version of the package a root is read from: its *.dist-info beside it, or the
    installed distribution's."""
    if package == "jax":
        return jax_version()
    metadata = sorted(_package_parent(package).glob(f"{package}-*.dist-info/METADATA"))
    for line in (metadata[0].read_text().splitlines() if metadata else ()):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    from importlib.metadata import version

    return version(package.replace("_", "-"))


def jax_version() -> str:
    from importlib.metadata import version

    return version("jax")


def _credit(entry: ThirdPartyKernel) -> str:
    """The header's provenance lines: which package, version and modules, and whose they are."""
    if entry.root == PALLAS_TPU_OPS:
        return (f"# from the installed jax {jax_version()}: " + ", ".join(entry.source_modules) + "\n"
                "# (Copyright The JAX Authors, Apache-2.0), followed by a wrapper of ours.\n")
    package = entry.root.split("/")[0]
    return (f"# from {package} {package_version(package)}, {entry.root}/: " + ", ".join(entry.source_modules)
            + f"\n# (Copyright the {package} authors, Apache-2.0), followed by a wrapper of ours.\n")


def build_source(entry: ThirdPartyKernel) -> str:
    """The candidate: the kernel module(s), rewritten as listed, then the entry's wrapper."""
    parts = [
        "from __future__ import annotations\n",
        f"# Built at test time by tests/thirdparty.py (entry {entry.name!r}, task {entry.task!r})\n"
        + _credit(entry),
    ]
    folder = source_dir(entry.root)
    for module in entry.source_modules:
        text = (folder / module).read_text()
        for rw in (*_REWRITES_ALWAYS, *entry.rewrites):
            if rw.module and rw.module != module:
                continue
            if rw.required and rw.old not in text:
                package = entry.root.split("/")[0]
                raise RuntimeError(f"{entry.name}: rewrite target {rw.old!r} not found in {module} "
                                   f"({package} {package_version(package)}); reason it existed: {rw.reason}")
            text = text.replace(rw.old, rw.new)
        parts.append(f"\n# ---- inlined: {entry.root}/{module} ----\n{text}")
    parts.append(f"\n# ---- wrapper (pallas-kernel-gym) ----\n{textwrap.dedent(entry.wrapper).strip()}\n")
    return "".join(parts)


# --- wrappers ----------------------------------------------------------------------------------
# Shared helpers, pasted into each wrapper that needs them (a candidate is one file).
_HELPERS = '''
def _round_up(x, m):
    return -(-x // m) * m


def _sublanes(dtype):
    """Rows of the native (rows, 128) VMEM tile: 8 for 32-bit, 16 for 16-bit types."""
    return 8 * (4 // jnp.dtype(dtype).itemsize)


def _tile(dim, align, target):
    """(block, padded dim): dim padded to a multiple of `align`; the block is `target` or the
    largest halving of it that divides the padded dim (`target` is `align` times a power of 2)."""
    padded = _round_up(dim, align)
    block = target
    while padded % block:
        block //= 2
    return block, padded
'''

# For flash kernels that take (batch, heads, seq, dim) and the inlined module's SegmentIds.
_PAD_SEQUENCE = '''

def _pad_sequence(q, k, v, sp):
    """q, k, v zero-padded along the sequence to sp, and segment ids that mask the padded keys
    (real tokens id 0, padding id 1: no real query sees a padded key, and every padded query has
    padded keys to see, so no row is empty); None where nothing is padded."""
    b, s = q.shape[0], q.shape[2]
    if sp == s:
        return q, k, v, None
    pad = ((0, 0), (0, 0), (0, sp - s), (0, 0))
    ids = jnp.broadcast_to((jnp.arange(sp) >= s).astype(jnp.int32), (b, sp))
    q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
    return q, k, v, SegmentIds(q=ids, kv=ids)
'''

_MATMUL = _HELPERS + '''

def kernel(x, y):
    """jax's example matmul: grid (M/bm, N/bn, K/bk) over blocks that must divide the
    dims, so unaligned dims are zero-padded (exact for a matmul) and the result sliced."""
    m, k = x.shape
    n = y.shape[1]
    if m <= 128:  # a few rows: one row block of the native tile height
        bm = mp = _round_up(m, _sublanes(x.dtype))
    else:
        bm, mp = _tile(m, 128, 256)
    bk, kp = _tile(k, 128, 512)
    bn, np_ = _tile(n, 128, 256)
    x = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    y = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    out = matmul(x, y, block_shape=(bm, bn), block_k=bk)
    return out[:m, :n]
'''


def _flash_fwd(causal: bool) -> str:
    return _HELPERS + _PAD_SEQUENCE + f'''

CAUSAL = {causal}


def kernel(q, k, v):
    """jax's flash attention forward. Its KV blocks must divide the sequence and be multiples
    of 128, so a sequence that is not a multiple of 128 is zero-padded and the padded keys are
    masked with its own segment ids (_pad_sequence)."""
    b, h, s, d = q.shape
    block, sp = _tile(s, 128, 512)
    q, k, v, segment_ids = _pad_sequence(q, k, v, sp)
    block_k = min(block, 128)
    sizes = BlockSizes(block_q=block, block_k_major=block, block_k=block_k, block_b=1)
    o = flash_attention(q, k, v, segment_ids=segment_ids, causal=CAUSAL, sm_scale=d ** -0.5,
                        block_sizes=sizes)
    return o[:, :, :s]
'''


def _flash_bwd(causal: bool) -> str:
    return _HELPERS + f'''

CAUSAL = {causal}


def kernel(q, k, v, o, lse, do):
    """jax's flash attention backward: its dkv and dq kernels, called as its VJP rule calls
    them. They rebuild p = exp(s - m) / l from the forward's running max m and normaliser l;
    our lse = m + log(l) gives the same p with m = lse and l = 1. di = rowsum(o * do) is
    computed outside the kernels, as jax's VJP rule does (O(n), under 1% of the FLOPs).
    Unaligned sequences: padded and masked with segment ids, as in the forward wrapper; the
    padded rows have do = 0 and so contribute nothing to dk and dv."""
    b, h, s, d = q.shape
    block, sp = _tile(s, 128, 256)
    segment_ids = None
    if sp != s:
        pad = ((0, 0), (0, 0), (0, sp - s), (0, 0))
        q, k, v, o, do = (jnp.pad(x, pad) for x in (q, k, v, o, do))
        lse = jnp.pad(lse, ((0, 0), (0, 0), (0, sp - s)))
        ids = jnp.broadcast_to((jnp.arange(sp) >= s).astype(jnp.int32), (b, sp))
        segment_ids = SegmentIds(q=ids, kv=ids)
    m = lse
    l = jnp.ones_like(lse)
    di = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    scale = d ** -0.5
    dk, dv = _flash_attention_bwd_dkv(
        q, k, v, None, segment_ids, l, m, do, di,
        block_q_major=block, block_q=128, block_k_major=block, block_k=128,
        sm_scale=scale, causal=CAUSAL, mask_value=DEFAULT_MASK_VALUE)
    dq, _ = _flash_attention_bwd_dq(
        q, k, v, None, segment_ids, l, m, do, di,
        block_q_major=block, block_k_major=block, block_k=128,
        sm_scale=scale, causal=CAUSAL, mask_value=DEFAULT_MASK_VALUE, debug=False)
    return dq[:, :, :s], dk[:, :, :s], dv[:, :, :s]
'''


_GMM = _HELPERS + '''

def kernel(lhs, rhs, group_sizes):
    """megablox gmm. It needs m divisible by its row tile tm: rows are zero-padded to a
    multiple of tm. The padded rows belong to no group (sum(group_sizes) == m), so gmm never
    stores them, and they are sliced off. k and n need no padding: gmm masks a partial last k
    tile and Pallas clips the partial last n block."""
    m, k = lhs.shape
    n = rhs.shape[2]
    if m <= 128:
        tm = mp = _round_up(m, _sublanes(lhs.dtype))
    else:
        tm, mp = _tile(m, 128, 128)
    tk = min(512, _round_up(k, 128))
    tn = min(512, _round_up(n, 128))
    lhs = jnp.pad(lhs, ((0, mp - m), (0, 0)))
    out = gmm(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=(tm, tk, tn))
    return out[:m]
'''


def _splash(causal: bool, mqa: bool, vmap: bool) -> str:
    if vmap:  # as jax's own tests call splash
        batch = "o = jax.vmap(lambda q_, k_, v_: splash(q_, k_, v_, segment_ids))(q, k, v)"
    else:
        batch = "o = jnp.stack([splash(q[i], k[i], v[i], segment_ids) for i in range(b)])"
    return _HELPERS + f'''

CAUSAL = {causal}
MQA = {mqa}


def kernel(q, k, v):
    """Splash attention takes one batch element ([heads, seq, head_dim]; MQA: k and v [seq,
    head_dim]); {"it is vmapped over the batch" if vmap else "it is called once per batch element"}.
    It applies no softmax scale, so q is scaled first (in float32, then back to q's dtype).
    Its blocks must divide the sequence and its KV compute block must be a multiple of 128:
    an unaligned sequence is zero-padded and the padded keys masked with segment ids (real 0,
    padding 1), as in the flash wrappers."""
    b, hq, s, d = q.shape
    q = (q.astype(jnp.float32) * d ** -0.5).astype(q.dtype)
    block, sp = _tile(s, 128, 512)
    segment_ids = None
    if sp != s:
        pad = ((0, 0), (0, 0), (0, sp - s), (0, 0))
        q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
        ids = (jnp.arange(sp) >= s).astype(jnp.int32)
        segment_ids = SegmentIds(q=ids, kv=ids)
    shape = (sp, sp)
    head_mask = mask_lib.CausalMask(shape) if CAUSAL else mask_lib.FullMask(shape)
    mask = mask_lib.MultiHeadMask([head_mask] * hq)
    sizes = BlockSizes(block_q=block, block_kv=block, block_kv_compute=128)
    if MQA:
        splash = make_splash_mqa(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
        k, v = k[:, 0], v[:, 0]
    else:
        splash = make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
    {batch}
    return o[:, :, :s]
'''


_PAGED = '''
def kernel(q, k_pages, v_pages, lengths, page_indices):
    """jax's paged attention (decode). It applies no softmax scale: q is scaled in float32
    (the kernel computes in float32 anyway) and the output cast back to q's dtype. One compute
    block is the largest number of pages that divides pages_per_sequence and spans at most
    256 tokens. NB: the kernel casts every loaded K and V page to bfloat16."""
    d = q.shape[-1]
    page_size = k_pages.shape[2]
    pages_per_seq = page_indices.shape[1]
    per_block = max(p for p in range(1, pages_per_seq + 1)
                    if pages_per_seq % p == 0 and (p == 1 or p * page_size <= 256))
    out = paged_attention(q.astype(jnp.float32) * d ** -0.5, k_pages, v_pages, lengths,
                          page_indices, pages_per_compute_block=per_block)
    return out.astype(q.dtype)
'''


# The grader runs a kernel's DEFAULT-precision float32 dots as a TPU's MXU does: operands
# rounded to bfloat16, one pass (evaluator/execution/program.py, tpu_dot_numerics). jax's attention
# kernels use DEFAULT precision, so on float32 inputs their logits come from bf16-rounded q and
# k. The forward tasks' tolerances were calibrated to accept exactly that (tasks/spec.py,
# ATTENTION_TOLERANCES), so the forward kernels are expected correct on both dtypes. The
# backward task gives the exact lse as an input, and default-precision logits against it put
# f32 gradients 3-7% (relative L2) off, more than a visibly corrupted block: its f32 cases ask
# for accurate logits (tasks/attention_bwd/task.py), so jax's backward is correct on bf16 only.
_BACKWARD_F32 = (" float32 cases: wrong_output, by design: its QK^T runs at default precision "
                 "(one bf16 pass on a TPU), and against the exact lse the task gives, the f32 "
                 "gradients are 3-7% off (relative L2), beyond the f32 bound.")

CORPUS: tuple[ThirdPartyKernel, ...] = (
    ThirdPartyKernel(
        name="jax_matmul", task="matmul", source_modules=("matmul.py",), wrapper=_MATMUL,
        splits_expected_correct=("train", "heldout"),
        note="Blocks must divide the dims (its grid uses //): unaligned dims are zero-padded."),
    ThirdPartyKernel(
        name="jax_flash_fwd", task="attention_fwd", source_modules=("flash_attention.py",),
        wrapper=_flash_fwd(causal=False), splits_expected_correct=("train", "heldout"),
        note="s=200 (heldout): padded to 256, padded keys masked with its segment ids."),
    ThirdPartyKernel(
        name="jax_flash_fwd_causal", task="attention_fwd_causal",
        source_modules=("flash_attention.py",), wrapper=_flash_fwd(causal=True),
        splits_expected_correct=("train", "heldout")),
    ThirdPartyKernel(
        name="jax_flash_bwd", task="attention_bwd", source_modules=("flash_attention.py",),
        wrapper=_flash_bwd(causal=False), splits_expected_correct=("train", "heldout"),
        dtypes_expected_correct=("bfloat16",), expected_failures=(("train", "wrong_output"),),
        note="Its dkv and dq kernels with m = lse, l = 1; di = rowsum(o * do) outside." + _BACKWARD_F32),
    ThirdPartyKernel(
        name="jax_flash_bwd_causal", task="attention_bwd_causal",
        source_modules=("flash_attention.py",), wrapper=_flash_bwd(causal=True),
        splits_expected_correct=("train", "heldout"), dtypes_expected_correct=("bfloat16",),
        expected_failures=(("train", "wrong_output"),), note=_BACKWARD_F32.strip()),
    ThirdPartyKernel(
        name="jax_megablox_gmm", task="grouped_matmul", source_modules=("megablox/gmm.py",),
        wrapper=_GMM, splits_expected_correct=("train", "heldout"),
        note="megablox/common.py (TPU-generation queries, dtype checks) stays an import: a "
             "helper, not a kernel. Rows padded to a multiple of the row tile. Its grid has a "
             "data-dependent dimension (the number of active m tiles)."),
    ThirdPartyKernel(
        name="jax_splash_mha_causal", task="attention_fwd_causal",
        source_modules=("splash_attention/splash_attention_kernel.py",),
        wrapper=_splash(causal=True, mqa=False, vmap=True),
        splits_expected_correct=("train", "heldout"),
        note="Mask modules imported; jax.vmap over the batch (a vmapped pallas_call: plain TPU "
             "interpret mode cannot run it with batch > 1, the grader's replay can); q "
             "pre-scaled."),
    ThirdPartyKernel(
        name="jax_splash_mqa", task="multi_query_attention",
        source_modules=("splash_attention/splash_attention_kernel.py",),
        wrapper=_splash(causal=False, mqa=True, vmap=False),
        splits_expected_correct=("train", "heldout"),
        note="Mask modules imported; one call per batch element; q pre-scaled."),
    ThirdPartyKernel(
        name="jax_paged_attention", task="paged_attention",
        source_modules=("paged_attention/paged_attention_kernel.py",), wrapper=_PAGED,
        splits_expected_correct=("train",),
        expected_failures=(("heldout", "lowering_error"),),
        note="float32: casts every K and V page to bfloat16 inside the kernel, as a TPU's "
             "default-precision dot would; under exact f32 dots that put it at the edge of the "
             "old f32 tolerance (failing 2, 1 and 1 of 2 cases on seeds 1, 2, 3), under the "
             "TPU-faithful tolerances it uses 0.38 of its bound over 20 seeds "
             "(tests/test_thirdparty.py also checks a fixed seed reproduces the same per-case "
             "verdicts). heldout: its m and l "
             "outputs reuse q's block spec, whose last dim is head_dim against an array dim of "
             "1; Pallas TPU lowering accepts that only when head_dim is a multiple of 128, and "
             "the held-out split has head_dim 64 (check case and bench case)."),
)

BY_NAME = {entry.name: entry for entry in CORPUS}
