"""The CPU inference engine's model: runs a ``.bnn`` file (``format.py``) with NumPy and Numba only.

    model = refimpl.engine.load("MODEL.bnn")
    logits = model.run(model.preprocess(images))        # or model.predict(images)

Execution follows the file's layer list:

* ``stem``: full-precision convolution (per image: im2col + a register-blocked float32 fma
  tile, ``float_kernels.stem``), folded BatchNorm, the sign bits of the first binary unit.
* ``binary_unit``: the input activation arrives already binarized and packed into this unit's
  zero-padded word buffer (the stem or the previous epilogue wrote it, or
  ``float_kernels.pack_padded`` after a pool); one popcount GEMM per convolution (``a``, and the
  window sums ``px``, taken while its tiles gather their input), ``pw`` and ``n`` precomputed per
  input shape, then one fused epilogue (``epilogue.py``): b, c, d, the measure, BatchNorm, the
  residual, and the sign bits for the next binary unit. With enough pixels to share out
  (``plan.FUSED_MIN_TILES_PER_THREAD``), GEMM and epilogue run together, tile by tile, in one
  parallel loop (``fused_*``), and ``a`` stays in L1. Otherwise (batch 1 on small maps, and
  debug runs, which record ``a``) they are two passes, the GEMM split over channels too.
  A ``real`` (Bi-Real) shortcut is computed first, in float32 from the unit's float input
  (``float_kernels.real_shortcut``: average pool, 1x1 convolution, folded BatchNorm), into the
  unit's output buffer; the epilogue then adds it as it adds an identity residual.
* ``maxpool2d`` / ``avgpool2d`` / ``global_avgpool`` / ``linear``: float32 (``plan.py``).

Activations are channels last, (N, H, W, C), from the stem on: the GEMM stores each pixel's
channels as one vector, and the epilogue, the sign packing and the residual all run along
contiguous channels, which stays vectorized on the 4x4 and 8x8 layers where a row of pixels is
too short (measured at batch 1: the epilogue of a 256-channel 8x8 layer went from 21 to 6 us).
``run`` still takes NCHW input, and debug records are NCHW, as torch has them.

Everything is float32 (counts are int32 until they enter the measure, exact in float32 below
2**24). Per input shape the engine keeps a plan (``plan.py``): buffers, GEMM indexing and window sums, so a
batch-1 call does no allocation beyond the outputs it returns.

Threads: ``run`` (and ``predict``) may be called from any number of threads, on one ``Model`` or
several, and every call returns what a serial run returns, bit for bit; the calls are
serialized, one at a time in a process (``_RUN_LOCK``): a plan's buffers are reused by every call
of its batch size, Numba's thread count is read once a run, and its default threading layer
cannot run two parallel regions at once. Numba parallelizes inside each call instead
(``numba.set_num_threads``), so serializing costs a server little; a process per worker runs
models truly at once. First runs compile each kernel once (``epilogue.py``).

Semantics are the PyTorch model's in eval mode: docs/design.md section 1 counts (padded taps count
in none of a, b, c, d), the measure as ``refimpl.measure(dtype=float32)`` computes it, BatchNorm
as torch's CPU kernel computes it (``bnn/export/model_file.py`` derives the folding).
"""
from __future__ import annotations

import threading
import time

import numba
import numpy as np

from . import budget, epilogue
from .float_kernels import RUN_THREADS
from .model_file import describe, read
from .plan import build_plan

# One run at a time in the process (the module docstring says why): a shared Model's plan
# buffers, the engine's thread count and Numba's parallel layer are not for two runs at once.
_RUN_LOCK = threading.RLock()
# Images ``predict`` normalizes and runs at a time (a model's logits of an image do not depend on
# the batch it runs in).
PREDICT_BATCH = 256


class Model:
    """A loaded ``.bnn`` model. ``run`` takes normalized NCHW float32; ``predict`` raw images."""

    def __init__(self, meta: dict, tensors: dict, path: str = "<memory>"):
        self.path = path
        self.meta = meta
        d = self.description = describe(meta, tensors, path)
        self.genome, self.input_shape, self.downsample, self.layers = d.genome, d.input_shape, d.downsample, d.layers
        self.counts = d.counts  # the count convention (refimpl/conventions.py)
        self.num_classes, self.class_names = d.num_classes, d.class_names
        self.mean, self.std, self.pixel_max = d.mean, d.std, d.pixel_max
        self._epilogue = epilogue.load(self.genome, self.counts)
        budget.check(self, 1)  # a file whose plan cannot fit is refused at load, before any allocation
        self._plans: dict = {}
        self.last_timings: list[tuple[str, float]] = []

    # -- plans ---------------------------------------------------------------------------------
    def _plan(self, n_img: int):
        key = (n_img, numba.config.NUMBA_NUM_THREADS)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build_plan(self, n_img)
        return plan

    def summary(self) -> str:
        """Each layer's output and costs (1-bit and 32-bit MACs, measure evaluations, bytes), as
        ``python -m refimpl.infer MODEL.bnn --summary`` prints them."""
        from . import summary

        return summary.text(self.description, summary.title(self.description, self.path))

    # -- running -------------------------------------------------------------------------------
    def check_input(self, x) -> np.ndarray:
        """Validate a normalized NCHW float32 batch (ValueError naming the problem)."""
        if not isinstance(x, np.ndarray):
            raise ValueError(f"input must be a NumPy array, got {type(x).__name__}")
        if x.dtype != np.float32:
            raise ValueError(f"normalized input must be float32, got {x.dtype}")
        if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"input has shape {x.shape}; this model takes (N, {', '.join(map(str, self.input_shape))})")
        if x.shape[0] == 0:
            raise ValueError("input has no images")
        # A read-only array (np.load with mmap, a frombuffer view) is copied: the kernels'
        # signatures take writable arrays, and Numba refuses a read-only one with a traceback.
        return np.require(x, requirements=("C", "A", "W"))

    def preprocess(self, images, layout: str | None = None) -> np.ndarray:
        """Raw images -> normalized float32 NCHW.

        Accepted: uint8 ``(N, H, W, C)`` (HWC, as images are stored), or float32 ``(N, C, H, W)``
        in the same raw pixel units (0..pixel_max, e.g. 0..255 for CIFAR, 0..16 for digits).
        Both get ``(pixel - mean[c]) / std[c]``, the normalization the model was trained with.
        """
        images = np.asarray(images)
        c, h, w = self.input_shape
        if images.dtype == np.uint8:
            if images.ndim != 4 or tuple(images.shape[1:]) != (h, w, c):
                raise ValueError(f"uint8 images must be (N, H, W, C) = (N, {h}, {w}, {c}), got {images.shape}")
        elif images.dtype == np.float32:
            if images.ndim != 4 or tuple(images.shape[1:]) != (c, h, w):
                raise ValueError(f"float32 images must be NCHW (N, {c}, {h}, {w}), got {images.shape}")
        else:
            raise ValueError(f"images must be uint8 (N, H, W, C) or float32 (N, C, H, W), got dtype {images.dtype}")
        if images.shape[0] == 0:
            raise ValueError("input has no images")
        mean, std = self.mean.reshape(1, c, 1, 1).astype(np.float32), self.std.reshape(1, c, 1, 1).astype(np.float32)
        # Same float32 operations as bnn.data.Dataset.normalize, (x - mean) / std, into one new
        # array (the input's size in float32, where three copies were made).
        if images.dtype == np.uint8:
            x = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
            x -= mean
        else:
            x = np.subtract(images, mean, dtype=np.float32)
        x /= std
        return x

    def predict(self, images) -> np.ndarray:
        """Logits (N, classes) float32 of raw images, as ``run(preprocess(images))`` gives them, a
        batch of PREDICT_BATCH images at a time: memory holds one batch in float32."""
        images = np.asarray(images)
        if images.ndim != 4 or len(images) <= PREDICT_BATCH:
            return self.run(self.preprocess(images))  # refused, or one batch
        return np.concatenate([self.run(self.preprocess(images[i:i + PREDICT_BATCH]))
                               for i in range(0, len(images), PREDICT_BATCH)])

    def run(self, x, debug: bool = False, timings: bool = False):
        """Logits (N, classes) float32 for normalized NCHW float32 ``x``.

        ``debug=True`` also returns, per binary convolution, ``{"name", "a", "b", "c", "d"}`` int64
        (N, O, Ho, Wo) counts and the unit's float output ``"y"``, for parity tests.
        ``timings=True`` records per-layer seconds in ``self.last_timings``.
        Safe from many threads: calls are serialized and each returns the serial result (the
        module docstring says why).
        """
        x = self.check_input(x)
        with _RUN_LOCK:
            RUN_THREADS[0] = numba.get_num_threads()
            plan = self._plan(x.shape[0])
            record = [] if debug else None
            clock = []
            for step in plan.steps:
                t0 = time.perf_counter() if timings else 0.0
                x = step(x, record)
                if timings:
                    clock.append((step.label, time.perf_counter() - t0))
            if timings:
                self.last_timings = clock
        return (x, record) if debug else x


def load(path: str) -> Model:
    """Load and validate a ``.bnn`` file; ``ModelFileError`` (a ValueError) names any problem."""
    meta, tensors = read(path)
    return Model(meta, tensors, path)
