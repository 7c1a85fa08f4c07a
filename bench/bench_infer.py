"""Binary ResNet-18 (CIFAR shape) in the Numba engine vs the same network in float32 PyTorch.

    python bench/bench_infer.py [--threads T] [--batch 64] [--repeats 30]
    python bench/bench_infer.py --measures paper [--rounds 7]     # baseline and M1..M10
    python bench/bench_infer.py --measure M6 --measure 3-0-3-0-0-1-6

With ``--measure``/``--measures`` it times searched measures instead (``bench/measure_bench.py``):
one engine per genome, each on its own export of the same ResNet-18, beside torch float32 and the
engine's baseline, in interleaved rounds; per measure images/s at the batch, ms at batch 1, time
relative to the baseline, and the epilogue's share of the network time.

Side by side in one process at the same thread count, repeats interleaved (engine, torch,
engine, ...) so that load from other processes hits both alike; times are medians.

* engine: ``refimpl.engine`` on an exported ``bnn.nn.models.resnet18`` (random weights, BatchNorm
  statistics set from random data), baseline measure, whole network from normalized float32
  input to logits.
* torch: ``bnn.nn.models.resnet18(binary=False)`` (the same shapes with ``nn.Conv2d``), eval,
  ``torch.inference_mode()``, channels_last. Its vector ISA is printed: with the engine forced
  below AVX-512 on an AVX-512 host, ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` hold
  torch to AVX2 too, for the ratio an AVX2 machine would see (docs/performance.md).

Then per-layer engine timings, and the binary GEMMs alone against the popcount ceiling: one
binary MAC is one bit of ``popcount(x AND w)``, counted nominally (N*Ho*Wo * O * C*KH*KW); the
ceiling is that of the kernel path in use (``refimpl/isa.py``; ``REFIMPL_ISA`` forces one),
measured in this run by ``bench/popcount_peak.c`` (bench_counts.py does the same); without gcc,
or if its build fails, the line says why and no ratio is printed. ``--json`` adds one JSON line
with the headline numbers, ``isa_path`` and ``torch_cpu_capability``. "GEMM alone" is the two-pass path's
GEMM (``_UnitStep.run_gemm``: counts ``a`` written to memory, image group by image group); where
a layer runs fused (GEMM and epilogue per tile, most layers at batch 64), its own GEMM is inside
the layer time and not separable, so the layer time minus this column only estimates what the
rest of the layer costs (the fused GEMM skips writing ``a``, so it is if anything faster).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_counts import cpu_name, popcount_peak  # noqa: E402
from engine_timing import build_models, gemm_report, interleaved, layer_report  # noqa: E402


def torch_isa_line() -> str:
    """Which vector ISA torch's kernels use; beside an engine held to AVX2 on an AVX-512 host, how
    to hold torch to AVX2 too (docs/performance.md: the ratio an AVX2 machine would see)."""
    import torch

    from refimpl import isa

    capability = torch.backends.cpu.get_cpu_capability()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    line = f"torch CPU capability {capability}" + (f", ONEDNN_MAX_CPU_ISA={onednn}" if onednn else "")
    if not isa.current_path().startswith("avx512") and capability.startswith("AVX512") and not onednn:
        line += ("  (torch runs AVX-512 code beside a lower engine path: for an AVX2 machine's ratio set "
                 "ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 as well)")
    return line


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--no-layers", action="store_true", help="skip the per-layer and GEMM tables")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the headline numbers")
    p.add_argument("--measure", action="append", default=[], metavar="GENOME",
                   help="time this measure (a name like M1 or a genome text) against the baseline; repeatable")
    p.add_argument("--measures", metavar="LIST", help="'paper' (baseline and M1..M10) or a comma-separated list")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the measure table (medians)")
    p.add_argument("--downsample", default="binary", choices=("binary", "real"),
                   help="the shortcut of a stage's first unit, for the measure table")
    p.add_argument("--model", default="resnet18", choices=("resnet18", "mnist_net"), help="the network of the measure table")
    p.add_argument("--cold", action="store_true",
                   help="measure table: compile every genome into a fresh epilogue cache (first-run times of never-seen genomes)")
    return p.parse_args(argv)


def _models(threads: int):
    """The binary model, its float twin (channels_last) and the engine loaded from the binary one's export."""
    import torch

    from refimpl import engine

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    bin_model, float_model, export_model = build_models()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet18.bnn")
        export_model(bin_model, path)
        eng = engine.load(path)
    float_model = float_model.to(memory_format=torch.channels_last)
    return bin_model, float_model, eng


def _check_engine(eng, bin_model, x1) -> None:
    import torch

    # The same predictions are not expected (different networks); check the engine is the real
    # binary model on this input by comparing with its own torch version once.
    with torch.no_grad():
        ref = bin_model(torch.from_numpy(x1)).numpy()
    got = eng.run(x1)
    assert np.array_equal(got.argmax(1), ref.argmax(1)) and np.allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _speed_table(args, eng, float_model, xb, x1) -> dict:
    """Time engine against torch at batch 1 and ``args.batch``, print both tables; the JSON summary."""
    import torch

    from refimpl import info, isa

    tb = torch.from_numpy(xb).contiguous(memory_format=torch.channels_last)
    t1 = torch.from_numpy(x1).contiguous(memory_format=torch.channels_last)

    def torch_run(t):
        with torch.inference_mode():
            return float_model(t)

    lat_cpu, thr_cpu = {}, {}
    lat = interleaved({"engine": lambda: eng.run(x1), "torch": lambda: torch_run(t1)}, args.repeats, lat_cpu, block=5)
    thr = interleaved({"engine": lambda: eng.run(xb), "torch": lambda: torch_run(tb)}, max(5, args.repeats // 3), thr_cpu)

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {platform.python_implementation()} "
          f"{platform.python_version()}, numba {numba.__version__}, torch {torch.__version__}, "
          f"threading layer {numba.threading_layer()}")
    print(f"{info.path_line()}; paths this CPU can execute: {', '.join(isa.executable_paths())}")
    print(torch_isa_line())
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  (timings are only "
          "comparable on a quiet machine; both sides share whatever load there was)")
    print(f"threads: {args.threads}; binary ResNet-18, CIFAR 32x32, baseline measure; medians\n")
    print(f"{'':28s} {'batch 1 latency':>16s} {'batch ' + str(args.batch) + ' images/s':>18s}")
    b1e, b1t = lat["engine"] * 1e3, lat["torch"] * 1e3
    ipe, ipt = args.batch / thr["engine"], args.batch / thr["torch"]
    print(f"{'engine (binary, Numba)':28s} {b1e:13.3f} ms {ipe:18.0f}")
    print(f"{'torch float32 channels_last':28s} {b1t:13.3f} ms {ipt:18.0f}")
    print(f"{'speed-up':28s} {b1t / b1e:15.1f}x {ipe / ipt:17.1f}x   (goal: 5x and 8x)")
    print("\nthe same runs in CPU time (immune to other processes taking the cores; at 1 thread the calling "
          "thread's, at more the process's, spinning included):")
    c1e, c1t = lat_cpu["engine"] * 1e3, lat_cpu["torch"] * 1e3
    cie, cit = args.batch / thr_cpu["engine"], args.batch / thr_cpu["torch"]
    print(f"{'engine (binary, Numba)':28s} {c1e:13.3f} ms {cie:18.0f}")
    print(f"{'torch float32 channels_last':28s} {c1t:13.3f} ms {cit:18.0f}")
    print(f"{'speed-up':28s} {c1t / c1e:15.1f}x {cie / cit:17.1f}x")

    return {"isa_path": isa.current_path(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_name(), "threads": args.threads, "batch": args.batch,
            "engine_ms_batch1": b1e, "torch_ms_batch1": b1t, "engine_images_per_s": ipe,
            "torch_images_per_s": ipt, "speedup_batch1": b1t / b1e, "speedup_batch": ipe / ipt,
            "load_average": list(load)}


def _layer_tables(args, eng, xb, x1, summary: dict) -> None:
    """Print the GEMM rate against the popcount ceiling and the per-layer table at batch 1 and
    ``args.batch``; add the rates to ``summary``."""
    ceiling = popcount_peak(args.threads)
    peak = ceiling.tera
    print(f"\n{ceiling.line()}")
    summary["ceiling_tera_macs"] = peak
    for n_img, x in ((1, x1), (args.batch, xb)):
        cpu_seconds = []
        rows = gemm_report(eng, x, max(5, args.repeats // 3), cpu_seconds)
        layers = dict(layer_report(eng, x, max(5, args.repeats // 3)))
        total = sum(layers.values())
        gemm_total = sum(r[2] for r in rows)
        macs = sum(r[1] for r in rows)
        gemm_rate = macs / gemm_total / 1e12
        # the ceiling is a CPU-time rate (the loop when it has the cores): the GEMMs also by CPU time,
        # per thread (process time at more threads counts every thread, spinning included)
        gemm_cpu_rate = macs / (sum(cpu_seconds) / args.threads) / 1e12
        share = (f"GEMMs at {100 * gemm_rate / peak:.0f}% of the {ceiling.path} ceiling ({peak:.2f} T/s; "
                 f"{100 * gemm_cpu_rate / peak:.0f}% by CPU time), whole network at "
                 f"{100 * macs / total / 1e12 / peak:.0f}%") if peak else "no ceiling measured"
        print(f"\nbatch {n_img}: whole network {total * 1e3:.3f} ms (sum of layers), binary GEMMs "
              f"{gemm_total * 1e3:.3f} ms for {macs / 1e9:.2f} G binary MACs = {gemm_rate:.2f} T/s; {share}")
        summary[f"gemm_tera_macs_batch{n_img}"] = gemm_rate
        summary[f"gemm_tera_macs_cpu_time_batch{n_img}"] = gemm_cpu_rate
        _print_layers(rows, layers)


def _print_layers(rows, layers: dict) -> None:
    """One line per engine layer: its time, the GEMMs of its unit alone, their rate and shapes."""
    print(f"  {'layer':16s} {'ms':>8s} {'GEMM ms':>8s} {'GEMM T/s':>9s}  shape (N, C, HxW out, O, k)")
    by_unit = {}
    for name, m_, t, shape in rows:
        unit = name.rsplit(".", 1)[0]
        by_unit.setdefault(unit, []).append((name, m_, t, shape))
    for label, t in layers.items():
        g = by_unit.get(label, [])
        gt = sum(r[2] for r in g)
        gm = sum(r[1] for r in g)
        shapes = "; ".join(f"{s[0]},{s[1]},{s[2]}x{s[2]},{s[3]},{s[4]}" for *_, s in g)
        rate = f"{gm / gt / 1e12:9.2f}" if gt else f"{'':9s}"
        print(f"  {label:16s} {t * 1e3:8.3f} {gt * 1e3:8.3f} {rate}  {shapes}")


def main(argv=None) -> int:
    """Run the benchmark and print its tables; 0."""
    args = _parse_args(argv)
    if args.measure or args.measures:
        from measure_bench import run_measures

        return run_measures(args)

    bin_model, float_model, eng = _models(args.threads)
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
    x1 = xb[:1].copy()
    _check_engine(eng, bin_model, x1)
    summary = _speed_table(args, eng, float_model, xb, x1)
    if not args.no_layers:
        _layer_tables(args, eng, xb, x1, summary)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
