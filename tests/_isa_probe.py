"""What one kernel path compiles to and computes: run as a script with REFIMPL_ISA set.

Prints one JSON object: the path this process compiled for, instruction counts of the popcount
panel (the blocked GEMM's inner loop), of the engine's tile (the byte-lookup dot products on the
paths without a vector popcount) and of the stem's float tile, and whether the counts API and the
engine's tile match the naive NumPy oracle (verify/naive.py) on shapes with word and tile tails.
``tests/test_isa_paths.py`` runs it once per path the host can execute.
"""
import json
import os
import re
import sys

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refimpl  # noqa: E402  (sets the target before anything compiles)
from refimpl import isa  # noqa: E402
from refimpl._jit import jit  # noqa: E402
from refimpl.engine.float_kernels import STEM_CHANNELS, STEM_PIXELS  # noqa: E402
from refimpl.kernels import _tiles, blocked, tiling  # noqa: E402
from refimpl.kernels.bits import pack_nchw  # noqa: E402
from refimpl.kernels.byte_dot import BYTE_LOOKUP  # noqa: E402
from verify import naive  # noqa: E402

PATTERNS = {
    "vpopcntq_zmm": r"vpopcntq\s+%zmm",
    "vpshufb_zmm": r"vpshufb\s+[^\n]*%zmm",
    "vpshufb_ymm": r"vpshufb\s+[^\n]*%ymm",
    "scalar_popcnt": r"\bpopcnt[lq]?\s",
    "vpaddb_ymm": r"vpaddb\s+[^\n]*%ymm",
    "zmm": r"%zmm",
    "ymm": r"%ymm",
    "fma_zmm": r"vfmadd\w*ps\s+[^\n]*%zmm",
    "fma_ymm": r"vfmadd\w*ps\s+[^\n]*%ymm",
    "fma_scalar": r"vfmadd\w*ss",
    "fmaf_call": r"call\w*\s+[^\n]*fmaf",
    # ARM64 (the portable path there): NEON byte popcounts and fused multiply-adds
    "cnt_16b": r"\bcnt\s+v\d+\.16b",
    "fmla_4s": r"\bfmla\s+v\d+\.4s",
}


def _asm(fn, signature, **options):
    kernel = jit(signature, cache=False, **options)(fn.py_func)  # uncached: a cached kernel has no asm to read
    return kernel.inspect_asm(kernel.signatures[0])


def _counts(asm):
    return {name: len(re.findall(pattern, asm)) for name, pattern in PATTERNS.items()}


def _hottest_loop(asm) -> dict:
    """Mnemonic counts of the basic block with the most popcount instructions (``vpshufb``,
    ``vpopcntq``, ARM64's ``cnt``): the tile's inner loop. ``stack``: its operands on the stack
    (spills)."""
    blocks, current = [], None
    for line in asm.splitlines():
        if re.match(r"^(\.LBB\S+|\S+):", line):
            current = []
            blocks.append(current)
        elif current is not None and line.strip() and not line.strip().startswith((".", "#")):
            current.append(line.strip())
            if re.match(r"(j\w+|b|b\.\w+|cbn?z|tbn?z|ret)\s", line.strip() + " "):
                current = []  # a branch ends the block: what falls through is another one
                blocks.append(current)
    loop = max(blocks, key=lambda ins: sum(i.startswith(("vpshufb", "vpopcntq", "cnt\t", "cnt ")) for i in ins), default=[])
    counts = {}
    for ins in loop:
        counts[ins.split()[0]] = counts.get(ins.split()[0], 0) + 1
    counts["stack"] = sum(any(base in ins for base in ("(%rsp)", "(%rbp)", "[sp")) for ins in loop)
    return counts


def _counts_match_naive() -> list[str]:
    rng = np.random.default_rng(7)
    failures = []
    for n, c, h, w, o, k, s, p, d in [(2, 1, 5, 6, 3, 3, 1, 1, 1), (1, 63, 6, 5, 9, 3, 2, 1, 1),
                                      (2, 65, 7, 7, 17, 3, 1, 2, 2), (1, 130, 4, 4, 8, 1, 1, 0, 1)]:
        x = rng.choice([-1.0, 1.0], size=(n, c, h, w)).astype(np.float32)
        wt = rng.choice([-1.0, 1.0], size=(o, c, k, k)).astype(np.float32)
        got = refimpl.counts_conv2d(x, wt, stride=s, padding=p, dilation=d)
        want = naive.counts_conv2d(x, wt, stride=s, padding=p, dilation=d)
        if not all(np.array_equal(g, e) for g, e in zip(got, want)):
            failures.append(f"conv2d {n}x{c}x{h}x{w} * {o}x{c}x{k}x{k} s{s} p{p} d{d}")
    for n, m, k in [(3, 5, 1), (4, 9, 64), (2, 7, 65), (5, 3, 200)]:
        x = rng.choice([-1.0, 1.0], size=(n, k))
        wt = rng.choice([-1.0, 1.0], size=(m, k))
        if not all(np.array_equal(g, e) for g, e in zip(refimpl.counts_dense(x, wt), naive.counts_dense(x, wt))):
            failures.append(f"dense {n}x{k} * {m}x{k}")
    return failures


def _engine_tile_failures() -> list[str]:
    """The engine's tile (nhwc ConvPlan) against the naive oracle's ``a``: word tails, tile and
    panel edges, more than 31 vectors a window (byte_dot's widening), all-ones windows."""
    rng = np.random.default_rng(11)
    failures = []
    for n, c, size, o, k, ones in [(2, 64, 5, 9, 3, False), (1, 129, 4, 8, 3, False), (1, 65, 3, 17, 1, False),
                                   (1, 960, 3, 8, 3, False), (1, 960, 3, 8, 3, True), (1, 64, 7, 8, 7, True)]:
        x = np.ones((n, c, size, size)) if ones else rng.choice([-1.0, 1.0], size=(n, c, size, size))
        wt = np.ones((o, c, k, k)) if ones else rng.choice([-1.0, 1.0], size=(o, c, k, k))
        pad = k // 2
        plan = blocked.ConvPlan(pack_nchw(wt.astype(np.float32)), n, size, size, (1, 1), (pad, pad), layout="nhwc")
        a = np.zeros((n, plan.out_h * plan.out_w, o), dtype=np.int32)
        plan(plan.pad(pack_nchw(x.astype(np.float32))), a)
        want = naive.counts_conv2d(x, wt, stride=1, padding=pad)[0].reshape(n, o, -1)
        if not np.array_equal(a.transpose(0, 2, 1), want):
            failures.append(f"engine tile {n}x{c}x{size}x{size} * {o}x{c}x{k}x{k}{' all ones' if ones else ''}")
    return failures


def _logits() -> dict:
    """Per hand-built model (every layer kind; the baseline measure, a searched one, Bi-Real's
    real-valued shortcut), the engine's logits on fixed random images as float32 bit patterns:
    the float parts (stem tile, epilogues, pooling, classifier) differ in code between paths,
    so equal bits across paths are a property of their fixed summation order, not a given."""
    import tempfile

    from _tiny_bnn import model_bytes, tiny_model

    from refimpl import engine
    images = np.random.default_rng(5).integers(0, 17, (6, 16, 16, 3), dtype=np.uint8)
    logits = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, genome, real in (("baseline", None, False), ("searched", "3-0-3-8-0-0-6", False),
                                   ("real_shortcut", "M3", True)):
            meta, tensors = tiny_model(seed=3, channels=3, side=16, classes=5, real=real)
            if genome:
                meta["genome"] = str(refimpl.Genome.parse(genome))
            path = os.path.join(folder, f"{name}.bnn")
            with open(path, "wb") as f:
                f.write(model_bytes(meta, tensors))
            logits[name] = engine.load(path).predict(images).view(np.uint32).ravel().tolist()
    return logits


def probe() -> dict:
    panel_asm = _asm(getattr(_tiles, tiling.panel_function_name(16, 8)), tiling.PANEL_SIGNATURE)
    tile_asm = _asm(getattr(_tiles, tiling.tile_function_name(16, 8)), tiling.TILE_FUNCTION_SIGNATURE,
                    slp_vectorize=not BYTE_LOOKUP)
    pixels, channels = STEM_PIXELS, STEM_CHANNELS
    stem = getattr(_tiles, f"stem_tile_{pixels}x{channels}")
    return {
        "path": isa.current_path(),
        "cpu_name": numba.config.CPU_NAME,
        "panel": _counts(panel_asm),
        "panel_loop": _hottest_loop(panel_asm),
        "byte_lookup": BYTE_LOOKUP,
        "engine_tile": _counts(tile_asm),
        "engine_loop": _hottest_loop(tile_asm),
        "engine_failures": _engine_tile_failures(),
        "stem": _counts(_asm(stem, "void(f4[:, ::1], f4[:, ::1], i8, i8, i8, f4[:, ::1])")),
        "stem_tile": [pixels, channels],
        "counts_failures": _counts_match_naive(),
        "logits": _logits(),
    }


if __name__ == "__main__":
    print(json.dumps(probe()))
