"""The fused CPU training measure from the one module of every genome (bnn/nn/measure_generic.py)
against each genome's own generated kernels (training's default) and against eager torch.

    python bench/bench_measure_generic.py                 # mnist_net, batch 128, one torch thread
    python bench/bench_measure_generic.py --threads 2 --rounds 15

First, in an empty measure cache (a temporary ``BNN_MEASURE_CACHE``, so nothing comes from an earlier
run): the CPU seconds of the first step of each case's genome, which compiles the one module once (its
first case) or the genome's own kernels each time. Then one step = forward + cross-entropy + backward +
Adam on a fixed random batch; the three models run in alternating rounds (load from other processes
hits them alike); printed: the median step in wall and process CPU time, and the host. The one module
and a genome's own kernels give the same bits (tests/test_measure_generic.py); the run checks it on the
two models' parameters.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ["BNN_MEASURE_CACHE"] = tempfile.mkdtemp(prefix="bnn-measure-bench-")  # before refimpl reads it

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_train import machine  # noqa: E402

from bnn.nn import measure_fused  # noqa: E402
from bnn.nn.layers import set_measure_impl  # noqa: E402
from bnn.nn.models import build_model  # noqa: E402
from bnn.train import ADAM_BETAS  # noqa: E402
from refimpl.cli import OneLineParser  # noqa: E402
from refimpl.isa import current_path  # noqa: E402

# A search's measures: the paper's with a table (M5), a gate (M6), both alpha and a division (M9), the
# baseline, and two random genomes the one module takes.
CASES = (("baseline", "raw"), ("M5", "laplace"), ("M6", "laplace"), ("M9", "raw"), ("16-7-11-12-1-12-2", "laplace"),
         ("9-2-0-12-11-10-8", "freq"))
PATHS = ("generic", "own", "eager")
_MODULE = measure_fused.module


def _use(path: str) -> None:
    # The fused layers ask measure_fused.module for their kernels: the one module, or the genome's own.
    measure_fused.module = (lambda g, tabled=False, generic=None: _MODULE(g, tabled, generic=path == "generic"))


def _stepper(genome: str, counts: str, batch: int, path: str):
    torch.manual_seed(0)
    model = set_measure_impl(build_model("mnist_net", genome, 10, (1, 28, 28), counts=counts),
                             "eager" if path == "eager" else "fused")
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, betas=ADAM_BETAS)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def step():
        _use(path)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model, step


def _bits(t) -> bytes:
    # The bits, every NaN as one (a diverging measure's parameters are NaN; LLVM keeps no NaN's sign).
    t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t.detach())
    return t.numpy().tobytes()


def _timed(step) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - w0, time.process_time() - c0


def _row(genome, counts, batch, rounds) -> tuple[dict, dict, dict, bool]:
    steppers = {path: _stepper(genome, counts, batch, path) for path in PATHS}
    first = {path: _timed(steppers[path][1])[1] for path in PATHS}  # the first step compiles
    times = {path: [] for path in PATHS}
    for r in range(rounds + 1):
        for path in PATHS:
            t = _timed(steppers[path][1])
            if r >= 1:
                times[path].append(t)
    same = all(_bits(a) == _bits(b) for a, b in zip(steppers["generic"][0].parameters(), steppers["own"][0].parameters()))
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    return first, wall, cpu, same


def main(argv=None) -> int:
    """Time the three paths on each case and print the table; exit status 1 if the fused paths' bits differ."""
    p = OneLineParser(prog="bench/bench_measure_generic.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a search worker's training)")
    p.add_argument("--batch", type=int, default=128, help="images per step (default 128)")
    p.add_argument("--rounds", type=int, default=9, help="timed steps per path (default 9), after the first and one more")
    args = p.parse_args(argv)
    if args.threads < 1 or args.batch < 1 or args.rounds < 1:
        p.error("--threads, --batch and --rounds must be at least 1")
    torch.set_num_threads(args.threads)
    print(f"host: {machine()}; refimpl kernel path {current_path()}")
    print(f"mnist_net, batch {args.batch}, {args.rounds} rounds, median step; first step: CPU s in an empty cache")
    print(f"{'genome':<20} {'counts':<8} {'first one/own/eager s':>22} {'one module ms':>14} {'own ms':>8} "
          f"{'eager ms':>9} {'one/own':>8} {'one/eager':>10} {'CPU one/own':>12}")
    try:
        for genome, counts in CASES:
            first, wall, cpu, same = _row(genome, counts, args.batch, args.rounds)
            firsts = "/".join(f"{first[k]:.1f}" for k in PATHS)
            print(f"{genome:<20} {counts:<8} {firsts:>22} {wall['generic'] * 1e3:>14.1f} {wall['own'] * 1e3:>8.1f} "
                  f"{wall['eager'] * 1e3:>9.1f} {wall['generic'] / wall['own']:>8.2f} "
                  f"{wall['generic'] / wall['eager']:>10.2f} {cpu['generic'] / cpu['own']:>12.2f}"
                  + ("" if same else "   PARAMETERS DIFFER"), flush=True)
            if not same:
                return 1
    finally:
        measure_fused.module = _MODULE
    return 0


if __name__ == "__main__":
    sys.exit(main())
