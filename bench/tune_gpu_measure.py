"""The launch shapes of bnn/gpu's measure kernels, swept on ResNet-18's binary layers (issue 37).

    python bench/tune_gpu_measure.py                    # CUDA: the sweep, then the whole step with the best
    python bench/tune_gpu_measure.py --budget-s 120     # stop starting new candidates after 120 s

For each of ResNet-18's binary output shapes at batch 128 (channels_last, as training runs them), each
candidate ``Tiling`` (bnn/gpu/measure_kernels.py: elements per program, pixels per tile at most, warps,
programs aimed for) is compiled, checked against the first candidate (the measure and dL/da bit for bit,
the summed gradients within float32 rounding of a different order of addition) and timed with CUDA
events. A candidate's cost is its time summed over the network's 19 binary layers (4, 5, 5 and 5 per
stage); the cheapest forward and backward are then set, and bench/profile_step.py's step of M6 under
laplace is timed with them (captured, and its kernels), then with the shipped tilings if time is left.
Offline, ``ptxas`` of the earlier 2048-element backward reported 255 registers and 1.3 KB of spills per
thread; two elements per thread take 128 registers, one 72 (docs/performance.md, GPU).
"""
from __future__ import annotations

import os
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

from bench_gpu_measure import cuda_ms  # noqa: E402

from bnn.gpu import measure_kernels as K  # noqa: E402
from bnn.gpu.counts import count_sums  # noqa: E402
from bnn.gpu.measure_op import use_triton_measure  # noqa: E402
from bnn.nn.layers import BinaryConv2d, ste_sign  # noqa: E402
from refimpl.cli import OneLineParser, positive_int  # noqa: E402

# (channels, side, binary layers of that output shape in ResNet-18: 4 convs, plus the shortcut after stage 1)
SHAPES = ((64, 32, 4), (128, 16, 5), (256, 8, 5), (512, 4, 5))
BACKWARD = (K.BACKWARD, K.Tiling(2048, 128, 4), K.Tiling(128, 16, 4), K.Tiling(128, 32, 4), K.Tiling(128, 4, 4), K.Tiling(128, 8, 4),
            K.Tiling(256, 16, 4), K.Tiling(256, 8, 4), K.Tiling(128, 16, 4, 2048), K.Tiling(64, 16, 2),
            K.Tiling(512, 16, 4))
FORWARD = (K.FORWARD, K.Tiling(512, 64, 4), K.Tiling(256, 16, 4), K.Tiling(256, 64, 4), K.Tiling(128, 16, 4),
           K.Tiling(512, 16, 4), K.Tiling(1024, 32, 8))


def build_parser() -> OneLineParser:
    """The command line (see the module docstring)."""
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default); cpu runs the plumbing under TRITON_INTERPRET=1")
    p.add_argument("--batch", type=positive_int, default=128, help="images (default 128)")
    p.add_argument("--genome", default="M6", help="the measure (default M6)")
    p.add_argument("--counts", default="laplace", help="the count convention (default laplace)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed launches per candidate (default 20)")
    p.add_argument("--budget-s", type=float, default=150.0, help="no new candidate after this many seconds")
    p.add_argument("--no-step", action="store_true", help="the sweep only, not the whole step after it")
    return p


def _time_ms(fn, iters: int) -> float:
    if not torch.cuda.is_available():  # the interpreter's smoke: the plumbing, not a time
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cuda_ms(fn, iters, warmup=1)


def layer_inputs(c: int, side: int, args) -> dict:
    """The measure's inputs of one 3x3 binary layer with c channels in and out: counts, buffers, a dy."""
    dev = torch.device(args.device)
    torch.manual_seed(c)
    layer = use_triton_measure(BinaryConv2d(c, c, 3, padding=1, measure=args.genome, counts=args.counts)).to(dev)
    x = torch.randn(args.batch, c, side, side, device=dev).to(memory_format=torch.channels_last)
    w = layer.weight.detach()
    layer(x)  # builds the layer's geometry and tables
    a, px, pw, rnd = count_sums(ste_sign(x, 1.0), ste_sign(w, None), (1, 1), (1, 1), (1, 1))
    common = (layer._gpu_nsz, layer._gpu_rows, layer._gpu_codes, layer.alpha.detach(), layer._gpu_tab)
    return {"a": a.detach(), "px": px.detach(), "pw": pw.detach(), "common": common, "dtab": layer._gpu_dtab,
            "round": rnd, "dy": torch.randn_like(a).contiguous(memory_format=torch.channels_last),
            "conv": K.CONVENTION_CODES[args.counts]}


def run_forward(t: dict):
    """The forward kernel on one layer's inputs."""
    return K.forward(t["a"], t["px"], t["pw"], *t["common"], t["round"])


def run_backward(t: dict):
    """The backward kernel on one layer's inputs (no clip)."""
    nsz, rows, codes, alpha, tab = t["common"]
    return K.backward(t["dy"], t["a"], t["px"], t["pw"], nsz, rows, codes, alpha, tab, t["dtab"], t["conv"], None,
                      t["round"])


def same(ref, got, exact: int) -> bool:
    """The first ``exact`` results bit for bit (NaN where NaN), the rest within a reordered sum's rounding."""
    ref, got = (ref,) if torch.is_tensor(ref) else ref, (got,) if torch.is_tensor(got) else got
    for i, (r, g) in enumerate(zip(ref, got)):
        if i < exact:
            if not torch.equal(torch.nan_to_num(r, nan=7.25), torch.nan_to_num(g, nan=7.25)):
                return False
        elif not torch.allclose(r, g, rtol=1e-4, atol=1e-4 * float(r.abs().nan_to_num().max()) + 1e-6, equal_nan=True):
            return False
    return True


def sweep(kind: str, candidates, layers, args, t_end: float) -> list[tuple]:
    """(weighted ms, candidate, per-shape ms) of each candidate tried before ``t_end``, cheapest first."""
    run, exact = (run_forward, 1) if kind == "forward" else (run_backward, 1)
    refs, rows = {}, []
    for cand in candidates:
        if time.perf_counter() > t_end:
            print(f"  {kind}: budget spent, {cand} and later not tried", flush=True)
            break
        setattr(K, kind.upper(), cand)
        t0, per, ok = time.perf_counter(), [], True
        try:
            for (c, side, _), t in zip(SHAPES, layers):
                out = run(t)
                if (c, side) not in refs:
                    refs[(c, side)] = out
                elif not same(refs[(c, side)], out, exact):
                    ok = False
                per.append(_time_ms(lambda: run(t), args.iters))
        except Exception as exc:  # noqa: BLE001 - one candidate's failure (out of resources, say) is reported
            print(f"  {kind} {cand}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            continue
        total = sum(ms * count for ms, (_, _, count) in zip(per, SHAPES))
        print(f"  {kind} {cand}: {total:.3f} ms per step ({', '.join(f'{ms:.3f}' for ms in per)} ms per layer)"
              f"{'' if ok else '  RESULTS DIFFER'}; {time.perf_counter() - t0:.1f} s with compiles", flush=True)
        if ok:
            rows.append((total, cand, per))
    return sorted(rows, key=lambda r: r[0])


def main(argv=None) -> int:
    """Sweep, choose, time the step; returns the exit status."""
    args = build_parser().parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        build_parser().error("--device cuda: no CUDA device here; give --device cpu under TRITON_INTERPRET=1")
    if not cuda and not K.INTERPRETED:
        build_parser().error("--device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
    from bnn.train.loop import setup_backend

    setup_backend(torch.device(args.device))
    t_start = time.perf_counter()
    name = torch.cuda.get_device_name() if cuda else "cpu (interpreter: every candidate is one program)"
    print(f"device: {name}, torch {torch.__version__}; {args.genome} under {args.counts}, "
          f"batch {args.batch}, channels_last; layer shapes {[(c, s, s) for c, s, _ in SHAPES]}", flush=True)
    shipped = (K.FORWARD, K.BACKWARD)
    layers = [layer_inputs(c, side, args) for c, side, _ in SHAPES]
    t_end = t_start + args.budget_s
    best_b = sweep("backward", BACKWARD, layers, args, t_start + args.budget_s * 0.7)
    best_f = sweep("forward", FORWARD, layers, args, t_end)
    chosen = (best_f[0][1] if best_f else shipped[0], best_b[0][1] if best_b else shipped[1])
    print(f"best: forward {chosen[0]}, backward {chosen[1]} ({time.perf_counter() - t_start:.0f} s so far)", flush=True)
    if args.no_step or not cuda:
        return 0
    from fitness_step import synthetic_data
    from profile_step import build_parser as step_parser
    from profile_step import profile

    step_args = step_parser().parse_args(["--device", "cuda"])
    data = synthetic_data(10 * step_args.batch, torch.device("cuda"))
    for name, (fwd, bwd) in (("tuned", chosen), ("shipped", shipped)):
        K.FORWARD, K.BACKWARD = fwd, bwd
        t0 = time.perf_counter()
        r = profile(data, f"{args.genome}:{args.counts}", step_args)
        print(f"step {name} ({fwd}, {bwd}): wall {r['wall_captured_ms']:.2f} ms/step captured, kernels "
              f"{r['kernel_ms']:.2f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
        for kname, ms, calls in r["rows"][:6]:
            print(f"    {ms:8.3f} ms {calls:5d}x  {kname[:90]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
