"""The CPU training step with each binary layer's input binarized in one Numba pass (bnn/nn/relax.py, the
default) against torch's operators (``ste_sign``, then the count convolution's own 0/1 relaxation).

    python bench/bench_relax_cpu.py                      # mnist_net, batch 128, one torch thread
    python bench/bench_relax_cpu.py --threads 2 --rounds 15

One step = forward + cross-entropy + backward + Adam on a fixed random batch, ``bnn.train``'s default
measure implementation. The two paths' models run in alternating rounds (load from other processes hits
both alike); printed: the median step in wall and process CPU time, one-pass / unfused, and the host.
Both paths give the same bits (tests/test_relax_cpu.py); the run checks it on the models' parameters.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_train import machine  # noqa: E402

from bnn.nn import layers  # noqa: E402
from bnn.nn.models import build_model  # noqa: E402
from bnn.train import ADAM_BETAS  # noqa: E402
from refimpl.cli import OneLineParser  # noqa: E402
from refimpl.isa import current_path  # noqa: E402

CASES = (("baseline", "raw"), ("M6", "laplace"), ("16-7-11-12-1-12-2", "laplace"))


def _stepper(genome: str, counts: str, batch: int):
    torch.manual_seed(0)
    model = build_model("mnist_net", genome, 10, (1, 28, 28), counts=counts)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, betas=ADAM_BETAS)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model, step


_APPLIES = layers.relax_applies  # the one-pass path's test; the unfused path swaps in one that never applies


def _timed(step, one_pass: bool) -> tuple[float, float]:
    layers.relax_applies = _APPLIES if one_pass else (lambda x: False)
    w0, c0 = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv=None) -> int:
    """Time both paths on each case and print the table; exit status 1 if their parameters differ."""
    p = OneLineParser(prog="bench/bench_relax_cpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a search worker's training)")
    p.add_argument("--batch", type=int, default=128, help="images per step (default 128)")
    p.add_argument("--rounds", type=int, default=9, help="timed steps per path (default 9), after 2 untimed")
    args = p.parse_args(argv)
    if args.threads < 1 or args.batch < 1 or args.rounds < 1:
        p.error("--threads, --batch and --rounds must be at least 1")
    torch.set_num_threads(args.threads)
    print(f"host: {machine()}; refimpl kernel path {current_path()}")
    print(f"mnist_net, batch {args.batch}, {args.rounds} rounds, median step")
    print(f"{'genome':<20} {'counts':<8} {'one-pass ms':>12} {'unfused ms':>11} {'wall ratio':>11} {'CPU ratio':>10}")
    for genome, counts in CASES:
        (m1, s1), (m0, s0) = _stepper(genome, counts, args.batch), _stepper(genome, counts, args.batch)
        times = {True: [], False: []}
        try:
            for r in range(args.rounds + 2):
                for one_pass, step in ((True, s1), (False, s0)):
                    t = _timed(step, one_pass)
                    if r >= 2:
                        times[one_pass].append(t)
        finally:
            layers.relax_applies = _APPLIES
        same = all(torch.equal(a, b) for a, b in zip(m1.parameters(), m0.parameters()))
        wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
        print(f"{genome:<20} {counts:<8} {wall[True] * 1e3:>12.1f} {wall[False] * 1e3:>11.1f} "
              f"{wall[True] / wall[False]:>11.2f} {cpu[True] / cpu[False]:>10.2f}"
              + ("" if same else "   PARAMETERS DIFFER"))
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
