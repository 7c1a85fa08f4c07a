"""The ``.bnn`` file (``format.py``; written by ``bnn/export/model_file.py``), read and checked for the engine.

A model file is data: nothing in it reaches a kernel unchecked. ``read`` takes only a regular
file, and only as many bytes as its safetensors header declares (``_safetensors.py``); ``describe`` checks every
field of the metadata for its JSON type (an integer is never a bool or a float), every
geometry for what the kernels can run (``_window``), every tensor for the dtype and shape the
metadata implies, and that the layers chain: each layer's channels and map are the previous
layer's output. Every problem is one ``ModelFileError`` line that starts with the file's name.
This is the one place that checks a file: the exporter runs ``describe`` on what it writes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..conventions import DEFAULT as DEFAULT_COUNTS
from ..conventions import NAMES as COUNT_CONVENTIONS
from ..genome import Genome
from ..kernels.bits import WORD_BITS, n_words
from ..kernels.geometry import FLOAT32_EXACT_COUNT
from ..kernels.window_sums import word_popcounts
from ._safetensors import ModelFileError, cut, is_int, json_value, read_container, show
from .format import (
    COUNTS_VERSION,
    DOWNSAMPLE_KINDS,
    FOREIGN_SHORTCUT,
    FORMAT,
    RESIDUALS,
    SUPPORTED_VERSIONS,
    VERSION,
    BinaryConv,
    BinaryUnit,
    Description,
    GlobalAvgPool,
    Linear,
    Pool,
    RealShortcut,
    Stem,
)

# Input sides and channels, and every stride and dilation, at most this: every geometry value
# and product the kernels compute then stays far inside int64.
MAX_SIDE = 1 << 16


def _pairs(entry: dict, where: str, keys) -> dict:
    out = {}
    for key in keys:
        v = entry.get(key)
        if not (isinstance(v, list) and len(v) == 2 and all(is_int(u) for u in v)):
            raise ModelFileError(f"{where}: '{key}' must be a pair of integers, got {show(v)}")
        out[key] = tuple(v)
    return out


def _count(entry: dict, key: str, where: str) -> int:
    v = entry.get(key)
    if not is_int(v) or v < 1:
        raise ModelFileError(f"{where}: '{key}' must be a positive integer, got {show(v)}")
    return v


def _text(entry: dict, key: str, where: str, default=None) -> str:
    v = entry.get(key, default)
    if not isinstance(v, str):
        raise ModelFileError(f"{where}: '{key}' must be a string, got {show(v)}")
    return v


def _tensor(tensors: dict, name: str, shape: tuple, dtype, where: str) -> np.ndarray:
    if name not in tensors:
        raise ModelFileError(f"{where}: tensor '{name}' is missing")
    t = tensors[name]
    if t.dtype != np.dtype(dtype) or tuple(t.shape) != tuple(shape):
        raise ModelFileError(
            f"{where}: tensor '{name}' is {t.dtype} {tuple(t.shape)}, metadata implies {np.dtype(dtype)} {tuple(shape)}"
        )
    if t.dtype.kind == "f" and not np.isfinite(t).all():  # it would only ever yield inf/NaN logits
        raise ModelFileError(f"{where}: tensor '{name}' holds inf or NaN (a diverged model); "
                             "export one whose training stayed finite")
    return np.ascontiguousarray(t)


def _window(where: str, hw, kernel, stride, padding, dilation=(1, 1), pool=False) -> tuple[int, int]:
    """The output map of a windowed layer (convolution or pool) over an ``hw`` map.

    ModelFileError for any geometry its kernels cannot run: they index a zero border ``padding``
    wide (a negative one reads outside the buffer), divide by the stride, and size buffers by the
    padded map. So kernel, stride and dilation are 1..MAX_SIDE, padding is 0 up to the kernel's
    extent (half the kernel for a pool, torch's rule, which leaves a pixel in every window) and
    up to the map side (which bounds every buffer by the input), and the output is at least 1x1.
    """
    for name, pair, low in (("kernel", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1)):
        if not all(low <= v <= MAX_SIDE for v in pair):
            raise ModelFileError(f"{where}: {name} {list(pair)} must lie in {low}..{MAX_SIDE}")
    out = []
    for side, k, s, p, d in zip(hw, kernel, stride, padding, dilation):
        extent = d * (k - 1) + 1
        limit = min(k // 2 if pool else extent, side)
        if not 0 <= p <= limit:
            bound = "half the kernel" if pool else f"the kernel extent {extent}"
            raise ModelFileError(f"{where}: padding {list(padding)} must lie in 0..{limit} ({bound}, "
                                 f"and at most the {hw[0]}x{hw[1]} map's side)")
        if extent > side + 2 * p:
            raise ModelFileError(f"{where}: a kernel {list(kernel)} of extent {extent} (dilation {list(dilation)}) "
                                 f"does not fit the {hw[0]}x{hw[1]} map padded by {list(padding)}: its output map is empty")
        out.append((side + 2 * p - extent) // s + 1)
    return out[0], out[1]


def read(path: str) -> tuple[dict, dict]:
    """(metadata, tensors) of a ``.bnn`` file, reading no more than its header declares."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    header, blob = read_container(path)
    meta = _metadata(header, path)
    try:
        tensors = load(blob)
    except (SafetensorError, ValueError, OSError) as exc:
        raise ModelFileError(f"{path}: tensors are unreadable ({' '.join(str(exc).split())})") from None
    return meta, tensors


def _metadata(header: dict, path: str) -> dict:
    """The engine's metadata (a JSON string in the header's ``__metadata__``), format and version checked."""
    entries = header.get("__metadata__", {})
    if not isinstance(entries, dict):
        raise ModelFileError(f"{path}: not a safetensors file ('__metadata__' is {show(entries)}, not an object)")
    meta_raw = entries.get(FORMAT)
    if meta_raw is None:
        raise ModelFileError(f"{path}: not a {FORMAT} model (no '{FORMAT}' metadata; export it with python -m bnn.export)")
    if not isinstance(meta_raw, str):
        raise ModelFileError(f"{path}: the '{FORMAT}' metadata is {show(meta_raw)}, not a JSON string")
    meta = json_value(meta_raw, path, f"the '{FORMAT}' metadata is not valid JSON")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ModelFileError(f"{path}: format is {show(got)}, expected {FORMAT!r}")
    version = meta.get("version")
    if not is_int(version) or version not in SUPPORTED_VERSIONS:
        raise ModelFileError(
            f"{path}: format version {show(version)} is not supported (this engine reads {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    return meta


# ----------------------------------------------------------------------------------------------
# The metadata's model description: input, classes, then one parser per layer kind
# ----------------------------------------------------------------------------------------------
def _count_convention(meta: dict, where: str) -> str:
    # Files written before conventions existed (version 1, no key) are raw; a version 1 file
    # that names another convention was not written by bnn.export, and version 2 must name one.
    counts = meta.get("counts", DEFAULT_COUNTS)
    if counts not in COUNT_CONVENTIONS:
        raise ModelFileError(f"{where}: counts must be one of {', '.join(COUNT_CONVENTIONS)}, got {show(counts)}")
    if (counts == DEFAULT_COUNTS) != (meta.get("version") == VERSION):
        raise ModelFileError(f"{where}: format version {meta.get('version')} does not go with counts {counts!r} "
                             f"(version {VERSION} is raw counts, {COUNTS_VERSION} another convention)")
    return counts


def _downsample_kind(meta: dict, where: str) -> str:
    kind = meta.get("downsample", "binary")  # files written before the option are binary
    if kind not in DOWNSAMPLE_KINDS:
        raise ModelFileError(f"{where}: downsample must be binary or real, got {show(kind)}")
    return kind


def _real_shortcut(entry, channels: int, out_channels: int, take, w: str) -> RealShortcut:
    """A ``real`` shortcut's record: avg-pool, 1x1 conv, BN."""
    if not isinstance(entry, dict):
        raise ModelFileError(f"{w}: missing description")
    i, o = entry.get("in_channels"), entry.get("out_channels")
    if not is_int(i) or i != channels:
        raise ModelFileError(f"{w}: takes {show(i)} channels, the previous layer gives {channels}")
    if not is_int(o) or o != out_channels:
        raise ModelFileError(f"{w}: gives {show(o)} channels, the unit's conv gives {out_channels}")
    pool = _pairs(entry, w, ("pool",))["pool"]
    if min(pool) < 1:
        raise ModelFileError(f"{w}: 'pool' must be positive, got {list(pool)}")
    p = _text(entry, "tensors", w)
    return RealShortcut(name=p, in_channels=i, out_channels=o, pool=pool,
                        weight=take(f"{p}.weight", (o, i, 1, 1), np.float32, w),
                        scale=take(f"{p}.scale", (o,), np.float32, w),
                        shift=take(f"{p}.shift", (o,), np.float32, w))


def _input_shape(meta: dict, where: str) -> tuple[int, int, int]:
    shape = meta.get("input_shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(is_int(v) and 1 <= v <= MAX_SIDE for v in shape)):
        raise ModelFileError(f"{where}: input_shape must be 3 integers (C, H, W) in 1..{MAX_SIDE}, got {show(shape)}")
    return tuple(shape)


def _classes(meta: dict, where: str) -> tuple[int, list[str]]:
    n = meta.get("num_classes")
    names = meta.get("class_names")
    if not is_int(n) or n < 1:
        raise ModelFileError(f"{where}: num_classes must be a positive integer, got {show(n)}")
    if not (isinstance(names, list) and len(names) == n and all(isinstance(v, str) for v in names)):
        raise ModelFileError(f"{where}: class_names must be {n} strings (num_classes), got {show(names)}")
    return n, names


def _finite_numbers(v, n: int) -> np.ndarray | None:
    """``v`` as n finite float32 values, or None if it is not a list of n such numbers."""
    if not (isinstance(v, list) and len(v) == n and all(isinstance(u, (int, float)) and not isinstance(u, bool) for u in v)):
        return None
    try:
        with np.errstate(over="ignore"):  # 1e308 becomes inf, refused just below
            out = np.asarray(v, dtype=np.float32)
    except OverflowError:  # an integer past float's range
        return None
    return out if np.isfinite(out).all() else None


def _normalization(meta: dict, c: int, where: str):
    """(mean, std, pixel_max) of the file's "input" entry."""
    inp = meta.get("input")
    if not isinstance(inp, dict):
        raise ModelFileError(f"{where}: 'input' must be an object with mean and std, got {show(inp)}")
    mean, std = _finite_numbers(inp.get("mean"), c), _finite_numbers(inp.get("std"), c)
    if mean is None or std is None:
        raise ModelFileError(f"{where}: input mean/std must have {c} finite values (input channels)")
    if not np.all(std > 0):
        raise ModelFileError(f"{where}: input std must be positive")
    pixel_max = inp.get("pixel_max")
    if pixel_max is not None and (_finite_numbers([pixel_max], 1) is None or pixel_max <= 0):
        raise ModelFileError(f"{where}: input pixel_max must be a positive number or null, got {show(pixel_max)}")
    return mean, std, pixel_max


@dataclass
class _Chain:
    """The activation between two layers while the metadata is parsed: its channels and map,
    which each layer checks its own against and then replaces; the tensors taken so far; and the
    file-wide facts a layer checks against."""

    tensors: dict
    c: int
    h: int
    w: int
    num_classes: int
    downsample: str
    used: set = field(default_factory=set)

    def take(self, name, shape, dtype, where) -> np.ndarray:
        self.used.add(name)
        return _tensor(self.tensors, name, shape, dtype, where)


def _parse_stem(idx, entry, chain: _Chain, w) -> Stem:
    geo = _pairs(entry, w, ("kernel", "stride", "padding", "dilation"))
    i, o = entry.get("in_channels"), _count(entry, "out_channels", w)
    if not is_int(i) or i != chain.c:
        raise ModelFileError(f"{w}: stem takes {show(i)} channels, the input has {chain.c}")
    chain.h, chain.w = _window(w, (chain.h, chain.w), **geo)
    p = _text(entry, "tensors", w, "stem")
    layer = Stem(name=p, in_channels=i, out_channels=o, **geo,
                 weight=chain.take(f"{p}.weight", (o, i, *geo["kernel"]), np.float32, w),
                 scale=chain.take(f"{p}.scale", (o,), np.float32, w),
                 shift=chain.take(f"{p}.shift", (o,), np.float32, w))
    chain.c = o
    return layer


def _parse_conv(entry, chain: _Chain, w) -> tuple[BinaryConv, tuple[int, int]]:
    """A binary convolution reading the chain's activation, and its output map."""
    if not isinstance(entry, dict):
        raise ModelFileError(f"{w}: missing description")
    geo = _pairs(entry, w, ("kernel", "stride", "padding", "dilation"))
    i, o = entry.get("in_channels"), _count(entry, "out_channels", w)
    if not is_int(i) or i != chain.c:
        raise ModelFileError(f"{w}: takes {show(i)} channels, the previous layer gives {chain.c}")
    out_map = _window(w, (chain.h, chain.w), **geo)
    p = _text(entry, "tensors", w)
    kh, kw = geo["kernel"]
    if i * kh * kw > FLOAT32_EXACT_COUNT:  # the epilogue takes the counts in float32
        raise ModelFileError(f"{w}: a window of {i} channels x {kh}x{kw} taps has {i * kh * kw} elements; "
                             "the engine's float32 counts are exact only to 2**24 (docs/design.md section 1)")
    conv = BinaryConv(
        name=p, in_channels=i, out_channels=o, **geo,
        bits=chain.take(f"{p}.bits", (o, kh, kw, n_words(i)), np.uint64, w),
        alpha=chain.take(f"{p}.alpha", (4, o), np.float32, w),
        scale=chain.take(f"{p}.scale", (o,), np.float32, w),
        shift=chain.take(f"{p}.shift", (o,), np.float32, w),
    )
    tail = i % WORD_BITS
    if tail and np.any(conv.bits[..., -1] >> np.uint64(tail)):
        raise ModelFileError(f"{w}: weight bits past channel {i} are set (docs/design.md section 1: tail bits are zero)")
    # popcount of every weight tap, for pw (the weight's window sums).
    taps = np.empty(o * kh * kw, dtype=np.int64)
    word_popcounts(np.ascontiguousarray(conv.bits.reshape(o * kh * kw, -1)), taps)
    conv.taps = taps.reshape(o, kh, kw)
    return conv, out_map


def _parse_binary_unit(idx, entry, chain: _Chain, w) -> BinaryUnit:
    name = _text(entry, "name", w, f"layer{idx}")
    conv, out_map = _parse_conv(entry.get("conv"), chain, f"{w} ({name}) conv")
    residual = entry.get("residual")
    if residual not in RESIDUALS:
        raise ModelFileError(f"{w}: residual must be none, identity, down or real, got {show(residual)}")
    if residual == FOREIGN_SHORTCUT[chain.downsample]:
        raise ModelFileError(f"{w}: a {residual!r} shortcut in a file whose downsample is {chain.downsample!r}")
    down = shortcut = None
    in_map = (chain.h, chain.w)
    if residual == "identity" and (conv.out_channels != chain.c or conv.stride != (1, 1) or out_map != in_map):
        raise ModelFileError(f"{w}: an identity shortcut needs stride 1 and equal channels and map; the conv maps "
                             f"{chain.c}x{in_map[0]}x{in_map[1]} to {conv.out_channels}x{out_map[0]}x{out_map[1]}")
    if residual == "down":
        down, down_map = _parse_conv(entry.get("down"), chain, f"{w} ({name}) down")
        if down.out_channels != conv.out_channels:
            raise ModelFileError(f"{w}: down and conv have different output channels")
        if down_map != out_map:
            raise ModelFileError(f"{w}: the down shortcut's output map {down_map[0]}x{down_map[1]} differs from "
                                 f"the conv's {out_map[0]}x{out_map[1]}")
    if residual == "real":
        shortcut = _real_shortcut(entry.get("shortcut"), chain.c, conv.out_channels, chain.take,
                                  f"{w} ({name}) shortcut")
        kh, kw = shortcut.pool
        # Ceil mode: the last window may overhang the map (torch's too), and a pool wider than the
        # map gives one pixel; the bound only keeps the kernel's indices small.
        pooled = (-(-chain.h // kh), -(-chain.w // kw))
        if max(kh, kw) > MAX_SIDE or pooled != out_map:
            raise ModelFileError(f"{w}: the real shortcut pools the {in_map[0]}x{in_map[1]} map by {[kh, kw]} to "
                                 f"{pooled[0]}x{pooled[1]}; the conv's output map is {out_map[0]}x{out_map[1]}")
    chain.c, (chain.h, chain.w) = conv.out_channels, out_map
    return BinaryUnit(name=name, conv=conv, residual=residual, down=down, shortcut=shortcut)


def _parse_pool(idx, entry, chain: _Chain, w) -> Pool:
    geo = _pairs(entry, w, ("kernel", "stride", "padding"))
    chain.h, chain.w = _window(w, (chain.h, chain.w), **geo, pool=True)
    include_pad = entry.get("count_include_pad", True)
    if not isinstance(include_pad, bool):
        raise ModelFileError(f"{w}: count_include_pad must be true or false, got {show(include_pad)}")
    return Pool(op=entry["op"], **geo, count_include_pad=include_pad)


def _parse_global_avgpool(idx, entry, chain: _Chain, w) -> GlobalAvgPool:
    chain.h = chain.w = 1
    return GlobalAvgPool()


def _parse_linear(idx, entry, chain: _Chain, w) -> Linear:
    p = _text(entry, "tensors", w, "classifier")
    fi, fo = entry.get("in_features"), entry.get("out_features")
    if not is_int(fi) or fi != chain.c:
        raise ModelFileError(f"{w}: linear takes {show(fi)} features, the previous layer gives {chain.c}")
    if not is_int(fo) or fo != chain.num_classes:
        raise ModelFileError(f"{w}: linear gives {show(fo)} outputs, num_classes is {chain.num_classes}")
    chain.c = fo
    return Linear(name=p, in_features=fi, out_features=fo, weight=chain.take(f"{p}.weight", (fo, fi), np.float32, w),
                  bias=chain.take(f"{p}.bias", (fo,), np.float32, w))


# One parser per layer kind: it validates the entry against the activation it reads (``chain``),
# takes its tensors, and leaves in ``chain`` the activation it gives. A new kind adds one here.
LAYER_PARSERS = {
    "stem": _parse_stem,
    "binary_unit": _parse_binary_unit,
    "maxpool2d": _parse_pool,
    "avgpool2d": _parse_pool,
    "global_avgpool": _parse_global_avgpool,
    "linear": _parse_linear,
}


def _parse_layers(layers, chain: _Chain, where: str) -> tuple[list, list]:
    """The engine's layer list from the metadata's, and each layer's output (C, H, W); ``chain``
    starts at the input."""
    if not isinstance(layers, list) or not layers:
        raise ModelFileError(f"{where}: 'layers' must be a non-empty list")
    ops = []
    for idx, entry in enumerate(layers):
        if not isinstance(entry, dict):
            raise ModelFileError(f"{where}: layer {idx} is not an object")
        op = entry.get("op")
        if not (isinstance(op, str) and op in LAYER_PARSERS):
            raise ModelFileError(f"{where}: layer {idx}: unknown op {show(op)}")
        ops.append(op)
    # The plan's steps hand each other packed bits or NCHW floats by position: only this order runs.
    ends = ("stem", "global_avgpool", "linear")
    if len(ops) < 3 or ops[0] != "stem" or ops[-2:] != ["global_avgpool", "linear"] or set(ops[1:-2]) & set(ends):
        raise ModelFileError(f"{where}: layers must run stem ... global_avgpool, linear")
    parsed, shapes = [], []
    for idx, (op, entry) in enumerate(zip(ops, layers)):
        parsed.append(LAYER_PARSERS[op](idx, entry, chain, f"{where}: layer {idx}"))
        shapes.append((chain.c, chain.h, chain.w))  # the layer's output, as the kernels will make it
    return parsed, shapes



def describe(meta: dict, tensors: dict, where: str) -> Description:
    """The checked description of a model; ModelFileError (one line, starting with ``where``)
    for anything the engine's kernels could not run as the file says."""
    if not isinstance(meta, dict):
        raise ModelFileError(f"{where}: the metadata must be a JSON object, got {show(meta)}")
    try:
        genome = Genome.parse(meta.get("genome"))
    except ValueError as exc:
        raise ModelFileError(f"{where}: genome: {cut(str(exc), 200)}") from None
    input_shape = _input_shape(meta, where)
    num_classes, class_names = _classes(meta, where)
    mean, std, pixel_max = _normalization(meta, input_shape[0], where)
    downsample = _downsample_kind(meta, where)
    counts = _count_convention(meta, where)
    chain = _Chain(tensors, *input_shape, num_classes, downsample)
    layers, shapes = _parse_layers(meta.get("layers"), chain, where)
    unused = set(tensors) - chain.used
    if unused:
        raise ModelFileError(f"{where}: tensors not described by the metadata: {cut(', '.join(sorted(unused)), 200)}")
    return Description(genome, input_shape, num_classes, class_names, mean, std, pixel_max, downsample, layers,
                       counts=counts, arch=_optional_text(meta, "arch"), dataset=_optional_text(meta, "dataset"),
                       source_sha256=_optional_text(meta, "source_sha256"), shapes=shapes)


def _optional_text(meta: dict, key: str) -> str | None:
    # informative fields, never checked: a value that is not a string is left out
    value = meta.get(key)
    return value if isinstance(value, str) else None
