"""Packed popcount counts vs torch float32 conv2d on the 3x3 layers of a CIFAR ResNet-18.

    python bench/bench_counts.py [--threads T] [--batch 64] [--rounds 9] [--repeats 5]

Everything is measured side by side in one process at the same thread count, interleaved: each
round times a block of ``--repeats`` calls (after one untimed call) of every row in turn, so that a drift of the shared
machine's speed (torch alone moves by about 10% from run to run here) hits all rows alike. A time
is the median over rounds of each block's median; a ratio is the median over rounds of that
round's torch time over the row's, with the lowest and highest round after it.
One binary MAC is one bit of ``popcount(x AND w)``; MACs are counted nominally
(N*Ho*Wo * O * C*KH*KW, padding included), as for the float conv.

Rows:
* ``torch conv2d``: ``F.conv2d`` float32, the faster of NCHW and channels_last.
* ``kernel``: the blocked popcount GEMM alone on packed operands (``a`` only).
* ``counts packed``: a, b, c, d from packed operands (window sums, then the fused kernel: the
  GEMM and the identities in one pass).
* ``counts API``: ``refimpl.counts_conv2d`` from +-1 float32 NCHW, packing included, returning
  four int64 arrays, as a loop that drops each result sees it (the memory of dropped outputs
  is recycled: fresh pages cost more than the popcounts; 32 bytes are written per output).
* ``API, out=``: the same call writing into four arrays from ``np.empty``, reused (``out=``).
* ``outputs alone``: only the fused kernel's output stage: the identities of a zero ``a`` written
  into the four int64 outputs with the same streaming stores, no popcounts. The API cannot be
  faster than this plus reading its float32 operands once.
The host line names the kernel path in use (``refimpl/isa.py``; ``REFIMPL_ISA`` forces one), and
``kernel/peak`` is the kernel against the ceiling of THAT path, measured in the same run by
``bench/popcount_peak.c`` (built with gcc; its best L1-resident loop for the path). Without gcc,
or if the build fails, the line says why and no ratio is printed. Then the torch count path
(bench/bench_counts_torch.py), if present.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import refimpl  # noqa: E402
from refimpl import info, isa  # noqa: E402
from refimpl._jit import jit  # noqa: E402
from refimpl.kernels import blocked  # noqa: E402
from refimpl.kernels.bits import pack_bits, pack_nchw  # noqa: E402
from refimpl.kernels.counts import counts_conv2d_packed  # noqa: E402
from refimpl.kernels.fused import finish_rows  # noqa: E402
from refimpl.kernels.outputs import address, fresh_outputs  # noqa: E402

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, spatial) of ResNet-18's 3x3 convs


def cpu_name() -> str:
    """The CPU's model name."""
    return info.cpu_model()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as text, or "n/a" where the OS has none."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def host_line(threads: int) -> str:
    """CPU, cores, the kernel path in use and how it was chosen, threads, the load average now."""
    return f"{cpu_name()}, {os.cpu_count()} cores; {info.path_line()}; {threads} threads; load average {load_average()}"


@dataclass
class Ceiling:
    """The popcount ceiling of one kernel path: ``tera`` T binary MACs/s, or None with ``note`` saying why."""

    path: str
    tera: float | None
    note: str  # the harness's line of every loop's rate, or why nothing was measured

    def line(self) -> str:
        """One line for the report: the ceiling and how it was measured, or why it was not."""
        if self.tera is None:
            return f"popcount ceiling of the {self.path} path: not measured ({self.note}); no ratio to it"
        return (f"popcount ceiling of the {self.path} path, measured now: {self.tera:.2f} T binary MACs/s "
                f"(bench/popcount_peak.c: {self.note})")


def popcount_peak(threads: int, path: str | None = None) -> Ceiling:
    """The ceiling of ``path`` (default: the path the kernels run) on ``threads`` threads, measured now."""
    path = path or isa.current_path()
    gcc = shutil.which("gcc")
    if gcc is None:
        return Ceiling(path, None, "gcc not found on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "peak")
        build = subprocess.run([gcc, "-O3", "-fopenmp", "-o", exe, str(HERE / "popcount_peak.c")],
                               capture_output=True, text=True, check=False)
        if build.returncode != 0:
            errors = [ln for ln in build.stderr.splitlines() if "error" in ln] or build.stderr.splitlines() or ["?"]
            return Ceiling(path, None, f"gcc failed: {errors[0].strip()}")
        run = subprocess.run([exe, path, str(threads)], capture_output=True, text=True, check=False)
        lines = run.stdout.strip().splitlines()
        if run.returncode != 0 or len(lines) < 2:
            why = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[0]
            return Ceiling(path, None, why)
        return Ceiling(path, float(lines[-1]), lines[-2])


def interleaved_times(variants: dict, rounds: int, repeats: int) -> dict[str, np.ndarray]:
    """Per variant, the median time of a block of ``repeats`` calls in each of ``rounds`` rounds.

    Each block starts with one untimed call: it times the steady state of a loop over one call,
    as the caches hold it, not the refill after the other variants' blocks.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            fn()
            block = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                block.append(time.perf_counter() - t)
            times[name].append(float(np.median(block)))
    return {name: np.array(ts) for name, ts in times.items()}


# The project's factory, so it compiles as the kernel it mirrors; not cached: Numba's own cache
# (this file is outside refimpl's stamp) would not see a change to refimpl's finish_rows.
@jit(parallel=True, cache=False)
def _write_outputs_only(stage, positions, n_out, px, pw, n, a, b, c, d, misaligned):
    # every (image, channel) row through the fused kernel's own output stage, from a zero ``a``
    ld = stage.shape[0] // n_out
    for img in numba.prange(px.shape[0] // positions):
        finish_rows(stage, ld, 0, n_out, n_out, img, 0, 0, positions, positions, n_out, px, pw, n, a, b, c, d,
                     misaligned, True)


def _time_layer(rng, n: int, channels: int, size: int, rounds: int, repeats: int) -> dict[str, np.ndarray]:
    """Every row's per-round times on one 3x3 layer (``channels`` in and out, ``size`` x ``size``, batch ``n``)."""
    import torch
    import torch.nn.functional as F

    x = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(n, channels, size, size))
    w = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(channels, channels, 3, 3))
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    xcl = xt.contiguous(memory_format=torch.channels_last)
    wcl = wt.contiguous(memory_format=torch.channels_last)
    xp, wp = pack_nchw(x), pack_bits(np.moveaxis(w, 1, -1))
    a = np.empty((n, channels, size * size), dtype=np.int64)
    out = tuple(np.empty((n, channels, size, size), dtype=np.int64) for _ in range(4))
    positions = size * size
    ld = -(-positions // 16) * 16
    stage = np.zeros(channels * ld, dtype=np.int64)
    zeros_x = np.zeros(n * positions, dtype=np.int64)
    zeros_w = np.zeros(channels * positions, dtype=np.int64)
    zeros_n = np.zeros(positions, dtype=np.int64)

    def outputs_alone():
        flats = [t.reshape(-1) for t in fresh_outputs((n, channels, size, size))]
        misaligned = np.array([address(t) % 64 // 8 for t in flats], dtype=np.int64)
        _write_outputs_only(stage, positions, channels, zeros_x, zeros_w, zeros_n, *flats, misaligned)

    with torch.inference_mode():
        return interleaved_times({
            "torch": lambda: F.conv2d(xt, wt, padding=1),
            "torch channels_last": lambda: F.conv2d(xcl, wcl, padding=1),
            "kernel": lambda: blocked.popcount_conv(xp, wp, (1, 1), (1, 1), (1, 1), size, size, a),
            "packed": lambda: counts_conv2d_packed(xp, wp, channels, 1, 1, 1),
            "api": lambda: refimpl.counts_conv2d(x, w, 1, 1, 1),
            "out": lambda: refimpl.counts_conv2d(x, w, 1, 1, 1, out=out),
            "outputs": outputs_alone,
        }, rounds, repeats)


def _print_row(channels: int, size: int, macs: int, times: dict[str, np.ndarray], peak: float | None) -> float:
    """Print one layer's row of the table; torch's median seconds on it."""
    torch_rounds = np.minimum(times["torch"], times["torch channels_last"])
    t_torch = float(np.median(torch_rounds))
    ms = lambda name: float(np.median(times[name])) * 1e3  # noqa: E731
    tera = lambda t_ms: macs / (t_ms * 1e-3) / 1e12  # noqa: E731

    def with_ratio(name):
        ratios = torch_rounds / times[name]
        return f"{ms(name):6.2f} ms x{np.median(ratios):4.1f} {ratios.min():3.1f}-{ratios.max():3.1f}"

    peak_share = f"{tera(ms('kernel')) / peak:.0%}" if peak else "n/a"
    print(
        f"{f'{channels}ch {size}x{size}':>11} | {t_torch * 1e3:9.2f} ms | "
        f"{ms('kernel'):6.2f} ms {tera(ms('kernel')):4.2f}T | {with_ratio('packed')} | "
        f"{with_ratio('api')} | {with_ratio('out')} | {ms('outputs'):10.2f} ms | {peak_share:>11}"
    )
    sys.stdout.flush()
    return t_torch


def main(argv=None) -> int:
    """Print the table of every layer, the ceiling and the torch count path's table; 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numba and torch (default: all cores)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9, help="rounds of interleaved blocks (default: 9)")
    parser.add_argument("--repeats", type=int, default=5, help="calls per block (default: 5)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(f"# {host_line(args.threads)}; batch {args.batch}")
    print(f"# numpy {np.__version__}, numba {numba.__version__}, torch {torch.__version__}")
    ceiling = popcount_peak(args.threads)
    peak = ceiling.tera
    print(f"# {ceiling.line()}")
    header = (f"{'layer':>11} | {'torch conv2d':>12} | {'kernel':>16} | {'counts packed':>23} | "
              f"{'counts API':>23} | {'API, out=':>23} | {'outputs alone':>13} | {'kernel/peak':>11}")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    n = args.batch
    for channels, size in LAYERS:
        macs = n * size * size * channels * channels * 9
        times = _time_layer(rng, n, channels, size, args.rounds, args.repeats)
        t_torch = _print_row(channels, size, macs, times, peak)
    print("# T = tera binary MACs/s; xR lo-hi = speed-up over torch conv2d float32: median round, lowest, highest")
    print("# kernel/peak: the kernel's wall-clock rate over the ceiling's CPU-time rate (the loop when it has the "
          f"cores): on a busy machine it reads low (load average now {load_average()})")
    print(f"# torch conv2d float32 reached {macs / t_torch / 1e12:.2f} T MACs/s on the last layer")

    torch_bench = HERE / "bench_counts_torch.py"
    if torch_bench.exists():
        print()
        sys.stdout.flush()
        subprocess.run([sys.executable, str(torch_bench), "--threads", str(args.threads)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
