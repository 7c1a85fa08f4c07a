"""The template of ``refimpl/engine/_drivers.py``: each kernel of the engine's epilogue
(``epilogue_template.py`` says what it computes) as a serial task over a range of tasks, and the
parallel loop that runs it. Both are the same for every genome and compiled once: a task calls the
popcount tile and the genome's ``measure_rows`` at their addresses, the driver calls the task at
its address (refimpl/engine/task_call.py says why)."""
from __future__ import annotations

from ..kernels.tiling import TILE_CHANNELS, TILE_PIXELS
from .epilogue_template import MODES, epilogue_parameters, fused_parameters


def _driver(name: str, parameters: str, counting: list[str]) -> list[str]:
    return [
        "",
        "",
        "@jit(parallel=True)",
        f"def {name}(task, parts, {parameters}):",
        f"    # ``task``: the address of {name}_task (refimpl/engine/task_call.py),",
        "    # called once for each of ``parts`` equal runs of the tasks (a few per thread).",
        *[f"    {line}" for line in counting],
        "    parts = max(1, min(n_tasks, parts))",
        "    for part in prange(parts):",
        "        call_task(task, np.int64(n_tasks * part // parts), np.int64(n_tasks * (part + 1) // parts),",
        f"                  {parameters})",
    ]


# The arguments of the genome's measure_rows after its rows: the counts of the main convolution
# (suffix "") or of the shortcut's ("2").
def _rows_call(rows: str, first: str, a: str, abase: str, px: str, pxbase: str, s: str, y: str, ybase: str) -> str:
    return (f"call_task(rows_fn, {rows}, {first}, positions, {a}, {abase}, {px}, {pxbase}, pw{s}, npw{s}, alpha{s}, scale{s},"
            f" shift{s}, tab{s}, toff{s}, tails{s}, {y}, {ybase})")


# The sign bits of a finished row ``outrow`` of pixel p of image i, into the next layer's words.
_PACK = [
    # From the row just written (in L1), by ``sign_word``'s vector compares; built inside the
    # channel loop they were per-lane shifts and an or-reduction, and made LLVM run that loop 8
    # lanes wide instead of 16.
    "if pack:",
    "    yy = p // width",
    "    xx = p - yy * width",
    "    for word in range(n_words):",
    "        o0 = word * 64",
    "        if o0 + 64 <= n_out:",
    "            acc = sign_word(outrow, o0)",
    "        else:",
    "            acc = np.uint64(0)",
    "            for o in range(o0, n_out):",
    "                # sign(0) = +1; NaN is not >= 0, so it binarizes to -1 as in torch.",
    "                acc |= np.uint64(outrow[o] >= F(0.0)) << np.uint64(o - o0)",
    "        bits[i, yy + pad_h, xx + pad_w, word] = acc",
]


def _finish(mode: str) -> list[str]:
    # The residual of pixel p of image i (yrow: the y the scratch holds for it), then its bits.
    # The additions keep the operands' order of y + residual and y + y2 (a NaN's payload).
    if mode == "none":
        return _PACK
    add = "yrow[o] + outrow[o]" if mode == "identity" else "outrow[o] + yrow[o]"
    return ["for o in range(np.uint64(n_out)):", f"    outrow[o] = {add}"] + _PACK


def _ys(mode: str, rows: str, first: str, a: str, abase: str, px: str, pxbase: str, a2: str, px2: str, px2base: str) -> list[str]:
    # none writes y straight into out; identity into the scratch (out holds the residual); down
    # its main y into out and the shortcut's into the scratch.
    if mode == "identity":
        return [_rows_call(rows, first, a, abase, px, pxbase, "", "yt", "np.int64(0)")]
    lines = [_rows_call(rows, first, a, abase, px, pxbase, "", "outflat", f"{first} * n_out")]
    if mode == "down":
        lines += [_rows_call(rows, first, a2, abase, px2, px2base, "2", "yt", "np.int64(0)")]
    return lines


def _epilogue_task(mode: str) -> list[str]:
    down = mode == "down"
    return [
        "",
        "",
        # noalias: out, bits and the scratch share memory with no other argument (plan.py).
        # no_cpython_wrapper: a task is only called at its address, by its driver.
        "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)",
        f"def epilogue_{mode}_task(task0, task1, {epilogue_parameters(mode)}):",
        "    # Channels last: a (N, P, O) int32; px (N, P); out (N, P, O); bits (N, Hp, Wp, K) uint64",
        "    # with zero borders, written when pack is True. A task owns one image and ``chunk``",
        "    # pixels, all their channels: it alone writes their words.",
        "    n_img, positions, n_out = a.shape",
        "    n_words = (n_out + 63) // 64",
        "    chunks = (positions + chunk - 1) // chunk",
        "    per_call = max(1, yscratch.shape[1] // n_out)  # rows of y the scratch holds",
        "    aflat = a.reshape(a.size)",
        "    pxflat = px.reshape(px.size)",
        *(["    outflat = out.reshape(out.size)"] if mode != "identity" else []),
        *(["    a2flat = a2.reshape(a2.size)", "    px2flat = px2.reshape(px2.size)"] if down else []),
        *(["    yt = yscratch[numba.get_thread_id()]"] if mode != "none" else []),
        "    for task in range(task0, task1):",
        "        i = task // chunks",
        "        p0 = (task - i * chunks) * chunk",
        "        p_end = min(positions, p0 + chunk)",
        "        for s0 in range(p0, p_end, per_call):",
        "            s1 = min(p_end, s0 + per_call)",
        "            g0 = i * positions + s0",
        *[f"            {line}" for line in _ys(mode, "np.int64(s1 - s0)", "g0", "aflat", "g0 * n_out", "pxflat", "g0",
                                              "a2flat", "px2flat", "g0")],
        "            for p in range(s0, s1):",
        "                outrow = out[i, p]",
        *(["                yrow = yt[(p - s0) * n_out:(p - s0 + 1) * n_out]"] if mode != "none" else []),
        *[f"                {line}" for line in _finish(mode)],
    ]


def _fused_task(mode: str) -> list[str]:
    down = mode == "down"
    # The tile through its address, called as it was when linked in. np.int64(0), not 0: Numba
    # types a literal argument as Literal[int](0), another signature.
    tile_call = ("call_task(tile_fn, xflat, {w}, k_words, {taps}, {bases}, n_out, n_pixels, first, np.int64(0), n_panels,"
                 " xscratch[tid], bscratch[tid], {a}, first, {px})")
    return [
        "",
        "",
        "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)",
        f"def fused_{mode}_task(tile0, tile1, {fused_parameters(mode)}):",
        "    # The popcount GEMM and the epilogue in one loop: a task is one tile of",
        f"    # {TILE_PIXELS} pixels with all their channels; its int32 ``a`` rows go to a per-thread block",
        "    # (ascratch, a few KB, in L1) and are consumed at once, never written to memory.",
        "    n_img, positions, n_out = out.shape",
        "    n_pixels = n_img * positions",
        f"    n_panels = (n_out + {TILE_CHANNELS - 1}) // {TILE_CHANNELS}",
        "    n_words = (n_out + 63) // 64",
        *(["    outflat = out.reshape(out.size)"] if mode != "identity" else []),
        "    # this thread's scratch (a task runs on one thread of the driver's parallel loop)",
        "    tid = numba.get_thread_id()",
        "    at = ascratch[tid]",
        "    pxt = pxscratch[tid]",
        *(["    yt = yscratch[tid]"] if mode != "none" else []),
        *(["    at2 = ascratch2[tid]"] if down else []),
        "    for tile in range(tile0, tile1):",
        f"        first = tile * {TILE_PIXELS}",
        "        " + tile_call.format(w="wflat", taps="taps_off", bases="bases", a="at", px=f"pxt[:{TILE_PIXELS}]"),
        *(["        " + tile_call.format(w="wflat2", taps="taps_off2", bases="bases2", a="at2", px=f"pxt[{TILE_PIXELS}:]")]
          if down else []),
        f"        rows = min({TILE_PIXELS}, n_pixels - first)",
        *[f"        {line}" for line in _ys(mode, "np.int64(rows)", "first", "at", "np.int64(0)", "pxt", "np.int64(0)",
                                          "at2", "pxt", f"np.int64({TILE_PIXELS})")],
        "        for q in range(rows):",
        "            i = (first + q) // positions",
        "            p = first + q - i * positions",
        "            outrow = out[i, p]",
        *(["            yrow = yt[q * n_out:(q + 1) * n_out]"] if mode != "none" else []),
        *[f"            {line}" for line in _finish(mode)],
    ]


def generate_drivers() -> str:
    """The text of ``refimpl/engine/_drivers.py``: each kernel's task and parallel loop, compiled
    once for every genome (refimpl/engine/task_call.py says why)."""
    out = [
        '"""GENERATED by ``python -m refimpl.codegen`` from ``refimpl/codegen/drivers_template.py``: do not edit."""',
        "import numba",
        "import numpy as np",
        "from numba import prange",
        "",
        "from .._jit import jit",
        "from ..kernels.bits import sign_word",
        "from .task_call import call_task",
        "",
        "F = np.float32",
    ]
    for mode in MODES:
        out += _epilogue_task(mode)
    for mode in MODES:
        out += _fused_task(mode)
    for mode in MODES:
        out += _driver(f"epilogue_{mode}", epilogue_parameters(mode), [
            "n_img, positions, n_out = a.shape",
            "n_tasks = n_img * ((positions + chunk - 1) // chunk)  # (image, chunk of pixels)"])
    for mode in MODES:
        out += _driver(f"fused_{mode}", fused_parameters(mode), [
            "n_img, positions, n_out = out.shape",
            f"n_tasks = (n_img * positions + {TILE_PIXELS - 1}) // {TILE_PIXELS}  # tiles of {TILE_PIXELS} pixels"])
    return "\n".join(out) + "\n"
