"""The search's fitness training on a CPU with the eager measure against the fused one, compile included.

    python bench/bench_search_measure.py                      # 8 random genomes, laplace, one torch thread
    python bench/bench_search_measure.py --genomes 4 --counts raw

Each training is ``python -m bnn.search``'s unit of work at its defaults (the digits preset's
``fitness_config``, the convention given), run in a process of its own with an empty measure cache
(a temporary ``BNN_MEASURE_CACHE``), so the fused path pays its compile of the genome's kernels as a
search worker meeting a new genome does. The two paths alternate which goes first, genome by genome
(load from other processes hits both alike). Printed: each training's CPU seconds and validation
accuracy (the paths agree to float32 rounding, not to the bit, so the accuracies may differ as
another seed's would), the totals' ratio, and the host.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

PATHS = ("eager", "fused")


def _child(path: str, genome: str, counts: str) -> None:
    import torch

    from bnn.search.fitness import fitness_config
    from bnn.search.loop import SearchConfig
    from bnn.train.loop import train_model

    torch.set_num_threads(1)  # a search worker's training
    train = SearchConfig(counts=counts).train_dict()
    train["measure_impl"] = path
    c0, w0 = time.process_time(), time.perf_counter()
    result = train_model(fitness_config(train, genome))
    print(json.dumps({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0,
                      "status": result.status, "val_acc": result.val_acc_per_epoch[-1]}))


def _run(path: str, genome: str, counts: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bnn-measure-bench-") as cache:
        env = {**os.environ, "BNN_MEASURE_CACHE": cache, "OMP_WAIT_POLICY": "PASSIVE"}
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, genome, counts],
                             env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise SystemExit(f"error: the {path} training of {genome} failed: {lines[-1] if lines else f'exit {out.returncode}'}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    """Train each genome both ways and print the table."""
    from bench_train import machine

    from refimpl.cli import OneLineParser, positive_int
    from refimpl.conventions import NAMES
    from refimpl.genome import N_BINARY, N_UNARY, Genome
    from refimpl.isa import current_path

    p = OneLineParser(prog="bench/bench_search_measure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--genomes", type=positive_int, default=8, help="random genomes (default 8)")
    p.add_argument("--seed", type=int, default=1, help="their draw (default 1)")
    p.add_argument("--counts", default="laplace", choices=NAMES, help="the count convention (default laplace)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    genomes = [str(Genome(tuple(int(rng.integers(0, N_UNARY)) for _ in range(4))
                          + tuple(int(rng.integers(0, N_BINARY)) for _ in range(3)))) for _ in range(args.genomes)]
    import torch

    torch.set_num_threads(1)  # as the children: the host line says so
    print(f"host: {machine()}; refimpl kernel path {current_path()}")
    print(f"the search's fitness training (digits preset), {args.counts}, one torch thread, an empty measure cache each")
    print(f"{'genome':<22} {'eager CPU s':>12} {'fused CPU s':>12} {'fused/eager':>12} {'eager acc':>10} {'fused acc':>10}")
    totals = {path: 0.0 for path in PATHS}
    for i, genome in enumerate(genomes):
        rows = {path: _run(path, genome, args.counts) for path in (PATHS if i % 2 == 0 else PATHS[::-1])}
        for path in PATHS:
            totals[path] += rows[path]["cpu_s"]
        e, f = rows["eager"], rows["fused"]
        print(f"{genome:<22} {e['cpu_s']:>12.1f} {f['cpu_s']:>12.1f} {f['cpu_s'] / e['cpu_s']:>12.2f} "
              f"{e['val_acc']:>10.4f} {f['val_acc']:>10.4f}", flush=True)
    print(f"{'total':<22} {totals['eager']:>12.1f} {totals['fused']:>12.1f} {totals['fused'] / totals['eager']:>12.2f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:5])
        sys.exit(0)
    sys.exit(main())
