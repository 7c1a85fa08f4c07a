"""One fitness evaluation of the search at the paper's settings, timed from a new genome to its score (issue 16).

    python bench/bench_fitness.py                          # CUDA when present, else the CPU
    python bench/bench_fitness.py --device cuda --compile --json
    python bench/bench_fitness.py --tiny --json            # the CPU smoke mode the tests run
    python bench/bench_fitness.py --device cuda --triton --graphs   # bnn.train --measure-impl triton --step graphs
    python bench/bench_fitness.py --device cuda --triton --graphs --compile --no-float   # inductor under the capture

The unit of work of ``python -m bnn.search --preset paper``: a binary ResNet-18 trained for
FITNESS.epochs epochs at FITNESS.batch_size images a step, Adam at FITNESS.lr (bnn/settings.py),
scored on held-out images after every epoch. The images are synthetic, random uint8 generated on
the device (no download, no file), 50,000 by default and split like the search's CIFAR-10 (a
tenth held out). One step is bnn.train's: augment, normalize, forward, cross-entropy, the
finite-loss check (every 16 steps on CUDA), backward, Adam.

It prints, and with --json writes as one JSON line:
* images/s of the binary network, and beside it of the float ResNet-18 under the same settings;
* seconds from a new genome to its first finished step (model built, compiled if asked, one
  step), for the first genome of the process and for a second, new one: what every later
  candidate of a search worker pays (with --triton: the kept model's genome rewritten and its
  parameters and Adam reset in place, as a search worker does, then one step of the same graph);
* seconds per evaluation of the paper's size (45,000 images x epochs, 5,000 validated after each
  epoch), extrapolated from the measured steps with the formula printed; --full runs one whole
  evaluation on the generated images and times it instead;
* evaluations per hour at K concurrent evaluations per device (--k, default 1,2,4): K processes
  run the measured step loop at the same time; 3600 x their aggregate images/s / (epochs x 45,000).
* the same for K models in this one process (--streams, default 2,4 on CUDA): each its own step
  (its own captured graph with --graphs), the K stepped in lockstep, each on a CUDA stream of its
  own. Processes take turns on a GPU (time slices), while one process's streams can run kernels
  side by side: this says whether a worker that trains K candidates at once would gain.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing as mp
import os
import queue
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]  # the repository and bench/ (imported as a file too)

from bench_train import machine  # noqa: E402
from fitness_report import report  # noqa: E402
from fitness_step import StepLoop, loop_options, sync, synthetic_data  # noqa: E402

from bnn.data import Dataset  # noqa: E402
from bnn.settings import FITNESS  # noqa: E402
from bnn.train.loop import evaluate, setup_backend  # noqa: E402
from refimpl.cli import OneLineParser, positive_int  # noqa: E402

PAPER_TRAIN, PAPER_VAL = 45_000, 5_000  # the search's CIFAR-10 split (bnn.data: 5,000 held out)
BARRIER_S = 1800  # longest wait of a K process for the others to be ready (compiles included)
NEW_GENOMES = ("M2", "M6", "M3")  # paper measures (M6 trained to 70% in the README's evidence)
# Networks that take CIFAR's 3x32x32 images; the smaller ones keep a CPU smoke short.
CIFAR_SHAPED = ("resnet18", "resnet34", "vgg13", "nin", "mnist_net")
TINY = {"images": 64, "batch": 4, "steps": 1, "warmup": 1, "k": [1, 2], "streams": [2]}
DEFAULTS = {"cuda": {"images": 50_000, "batch": FITNESS.batch_size, "steps": 50, "warmup": 10, "k": [1, 2, 4],
                     "streams": [2, 4]},
            "cpu": {"images": 50_000, "batch": FITNESS.batch_size, "steps": 3, "warmup": 1, "k": [1, 2, 4],
                    "streams": []}}


def _k_list(text: str) -> list[int]:
    if text == "none":
        return []
    try:
        ks = [int(v) for v in text.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1 or len(set(ks)) != len(ks):
        raise argparse.ArgumentTypeError(f"expected distinct positive integers separated by commas, or none, got {text!r}")
    return ks


def build_parser() -> OneLineParser:
    """The command line (see the module docstring); sizes left unset take the device's defaults."""
    p = OneLineParser(prog="bench/bench_fitness.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--model", default="resnet18", choices=CIFAR_SHAPED,
                   help="the network, binary and float (default resnet18, the paper's fitness network)")
    p.add_argument("--images", type=positive_int, help="synthetic images on the device, a tenth held out (default 50000)")
    p.add_argument("--batch", type=positive_int, help=f"images per step (default {FITNESS.batch_size}, the paper's)")
    p.add_argument("--steps", type=positive_int, help="timed steps per measurement (default 50 on CUDA, 3 on the CPU)")
    p.add_argument("--warmup", type=positive_int, help="untimed steps first (default 10 on CUDA, 1 on the CPU)")
    p.add_argument("--k", type=_k_list, help="concurrent evaluations per device to measure (default 1,2,4; none: skip)")
    p.add_argument("--streams", type=_k_list,
                   help="K models in this process, each on its own CUDA stream, to measure (default 2,4 on CUDA, none "
                        "on the CPU, where the K step in turn; none: skip)")
    p.add_argument("--no-float", action="store_true", help="skip the float ResNet-18")
    p.add_argument("--genome", default="baseline", help="the measure trained (default baseline)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model, as bnn.train --compile does")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--measure-op", action="store_true",
                   help="the measure as one opaque operator (bnn/nn/measure_op.py): a new genome reuses the compiled step")
    p.add_argument("--fused-adam", action="store_true", help="Adam's fused kernel (CUDA)")
    p.add_argument("--cudagraphs", action="store_true",
                   help="with --compile: mode reduce-overhead, the step's kernels replayed as CUDA graphs (bnn.train "
                        "--step graphs; the genome stays in the graph, so not with --measure-op)")
    p.add_argument("--triton", action="store_true",
                   help="the binary layers through bnn/gpu's Triton operator (bnn.train --measure-impl triton; CUDA, or "
                        "TRITON_INTERPRET=1 on a CPU); a new genome is set in place on the kept model")
    p.add_argument("--graphs", action="store_true",
                   help="the whole step (forward, loss, backward, fused Adam) captured as one CUDA graph, binary and float "
                        "alike (bnn.train --step graphs with --measure-impl triton); on a CPU the same step, uncaptured")
    p.add_argument("--counts", default="raw", help="the count convention of the binary layers (default raw)")
    p.add_argument("--full-genome", help="the genome of the whole evaluation (default: a paper measure not yet trained)")
    p.add_argument("--full-epochs", type=positive_int, default=FITNESS.epochs,
                   help=f"epochs of the whole evaluation (default {FITNESS.epochs}, the paper's fitness; fewer: a smoke run)")
    p.add_argument("--full", action="store_true", help="also run and time one whole evaluation")
    p.add_argument("--full-only", action="store_true",
                   help="only the whole evaluation, timed from a new genome in this fresh process (compile included)")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke sizes: 64 images, batch 4, 1 step, K = 1,2, streams 2 (each can still be set)")
    p.add_argument("--json", action="store_true", help="one JSON line with every number on stdout, nothing else")
    return p


def resolve(args) -> argparse.Namespace:
    """Fill the defaults and check what argparse cannot; ValueError with the one-line reason."""
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: no CUDA device here; use --device cpu")
        index = name.partition(":")[2]
        if name != "cuda" and not (index.isdigit() and int(index) < torch.cuda.device_count()):
            raise ValueError(f"--device {args.device}: this machine has cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif name != "cpu":
        raise ValueError(f"--device {args.device!r}: expected auto, cpu, cuda or cuda:N")
    args.device = name
    if args.cudagraphs and not (args.compile and name.startswith("cuda")):
        raise ValueError("--cudagraphs captures CUDA graphs of the compiled step: give it with --compile on a CUDA device")
    if args.cudagraphs and args.measure_op:
        raise ValueError("--cudagraphs with --measure-op would never capture (the operator takes a CPU tensor); "
                         "give one of them")
    if args.graphs and args.measure_op:
        raise ValueError("--graphs captures the step with the Triton operator, not --measure-op's CPU-side one; give one")
    if args.graphs and args.compile and args.compile_backend != "inductor" and name.startswith("cuda"):
        raise ValueError("--graphs --compile captures inductor's kernels; give --compile-backend inductor")
    if args.triton:
        from bnn.gpu.require import triton_problem

        if triton_problem(name.partition(":")[0]):
            raise ValueError(triton_problem(name.partition(":")[0]))
    from refimpl.conventions import check_counts

    check_counts(args.counts)
    base = TINY if args.tiny else DEFAULTS["cuda" if name.startswith("cuda") else "cpu"]
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from refimpl.genome import Genome

    args.genome = str(Genome.parse(args.genome))
    # Genomes this process has not trained: one for the new-genome timing, one for --full.
    args.new_genome, full = [g for g in (str(Genome.parse(n)) for n in NEW_GENOMES) if g != args.genome][:2]
    args.full_genome = str(Genome.parse(args.full_genome)) if args.full_genome else full
    val = args.images // 10
    if args.images - val < args.batch:
        least = args.batch
        while least - least // 10 < args.batch:
            least += 1
        raise ValueError(f"--images {args.images} leaves {args.images - val} training images, fewer than --batch "
                         f"{args.batch}; give --images {least} or more")
    if val < 1:
        raise ValueError(f"--images {args.images} holds out no validation image; give --images 10 or more")
    return args


def step_kind(args) -> str:
    """The name of the step this run times: graphs (graphs+inductor with --compile), compiled or eager."""
    if args.graphs:
        return "graphs+inductor" if args.compile else "graphs"
    return "compiled" if args.compile else "eager"


def first_step_s(data: Dataset, genome: str, binary: bool, opts: dict) -> float:
    """Seconds from nothing to one finished step of a new model for ``genome`` (build, compile, step)."""
    sync(data.device)
    t0 = time.perf_counter()
    StepLoop(data, genome, binary, opts).run(1)
    return time.perf_counter() - t0


def first_steps(args, data: Dataset) -> dict:
    """First-step seconds of the binary network: eager (and compiled when asked), first and a new genome;
    with --triton, the run's own step kind, the new genome set on the first one's kept loop."""
    if args.triton:
        sync(data.device)
        t0 = time.perf_counter()
        loop = StepLoop(data, args.genome, True, loop_options(args))
        loop.run(1)
        t1 = time.perf_counter()
        loop.new_genome(args.new_genome)
        loop.run(1)
        return {step_kind(args): {"first_genome": t1 - t0, "new_genome": time.perf_counter() - t1}}
    out = {}
    if args.graphs:
        modes = [(step_kind(args), args.compile)]
    else:
        modes = [("eager", False)] + ([("compiled", True)] if args.compile else [])
    for mode, compiled in modes:
        opts = {**loop_options(args), "compile": compiled}
        out[mode] = {"first_genome": first_step_s(data, args.genome, True, opts),
                     "new_genome": first_step_s(data, args.new_genome, True, opts)}
    return out


def throughput(args, data: Dataset, binary: bool) -> tuple[float, float, StepLoop]:
    """(images/s, seconds per step, the loop) over ``args.steps`` timed steps after the warm-up."""
    loop = StepLoop(data, args.genome if binary else "baseline", binary, loop_options(args))
    loop.run(args.warmup)
    elapsed = loop.run(args.steps)
    return args.steps * args.batch / elapsed, elapsed / args.steps, loop


def validation_s(loop: StepLoop) -> float:
    """Seconds of one validation pass over the held-out images (bnn.train's evaluate), after one untimed."""
    evaluate(loop.model, loop.data, loop.data.val_x, loop.data.val_y)
    sync(loop.data.device)
    t0 = time.perf_counter()
    evaluate(loop.model, loop.data, loop.data.val_x, loop.data.val_y)
    sync(loop.data.device)
    return time.perf_counter() - t0


def _child(rank: int, k: int, args: dict, barrier, results) -> None:
    # One of K processes: warm up, wait for the others, run the timed steps, report wall times.
    try:
        device = torch.device(args["device"])
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // k))
        setup_backend(device)
        data = synthetic_data(args["images"], device, seed=rank)
        loop = StepLoop(data, args["genome"], True, args["opts"], seed=rank)
        loop.run(args["warmup"])
        barrier.wait(timeout=BARRIER_S)
        t0 = time.time()  # wall clock: comparable across the K processes
        loop.run(args["steps"])
        results.put({"rank": rank, "t0": t0, "t1": time.time(), "images": args["steps"] * args["opts"]["batch"]})
    except BaseException as exc:  # noqa: BLE001 - reported by the parent as this K's failure
        barrier.abort()
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                     if str(exc).strip() else type(exc).__name__})


def _process_context(device: str):
    """How the K processes start: on the CPU from a fork server that imported torch, dynamo (Adam's first
    step imports it) and this script once, where spawn paid 7 s of CPU for them in every process; spawn
    on CUDA, where a fork server is not yet measured on a GPU, and where fork servers do not exist."""
    if device != "cpu" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "torch._dynamo"])
    return ctx


def concurrent(args, k: int) -> dict:
    """K processes on the device at once, each running the measured step loop: their aggregate images/s."""
    ctx = _process_context(args.device)
    barrier, results = ctx.Barrier(k), ctx.Queue()
    child_args = {"device": args.device, "images": args.images, "genome": args.genome, "warmup": args.warmup,
                  "steps": args.steps, "opts": loop_options(args)}
    procs = [ctx.Process(target=_child, args=(r, k, child_args, barrier, results), daemon=True) for r in range(k)]
    for p in procs:
        p.start()
    got: list[dict] = []
    while len(got) < k:
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                barrier.abort()  # one died without a word: the others stop waiting for it
            if all(p.exitcode is not None for p in procs):
                while not results.empty():
                    got.append(results.get())
                if len(got) < k:
                    got.append({"error": "a process died: exit codes " + ", ".join(str(p.exitcode) for p in procs)})
                break
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    errors = [r["error"] for r in got if "error" in r]
    if errors:
        return {"k": k, "error": errors[0]}
    span = max(r["t1"] for r in got) - min(r["t0"] for r in got)
    rate = sum(r["images"] for r in got) / span
    return {"k": k, "images_per_s": rate, "evaluations_per_hour": evaluations_per_hour(rate)}


def in_process(args, data: Dataset, k: int) -> dict:
    """K models (seeds 0..K-1) in this process, stepped in lockstep, each on its own CUDA stream: their
    aggregate images/s. On the CPU there are no streams and the K step in turn (a smoke of the plumbing)."""
    cuda = data.device.type == "cuda"
    streams = [torch.cuda.Stream(data.device) if cuda else None for _ in range(k)]
    loops = []
    for rank, stream in enumerate(streams):
        with _on(stream):  # built, warmed up and captured on its stream, as it then runs
            loop = StepLoop(data, args.genome, True, loop_options(args), seed=rank)
            loop.run(args.warmup)
        loops.append(loop)
    sync(data.device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        for loop, stream in zip(loops, streams):
            with _on(stream):
                loop.step()
    sync(data.device)
    rate = k * args.steps * args.batch / (time.perf_counter() - t0)
    del loops
    _free(data.device)
    return {"k": k, "images_per_s": rate, "evaluations_per_hour": evaluations_per_hour(rate), "streams": cuda}


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _with_overhead(row: dict, overhead: float) -> dict:
    # K evaluations at the aggregate rate, each also paying its validation and new-genome set-up.
    if "images_per_s" in row:
        train_s = FITNESS.epochs * PAPER_TRAIN * row["k"] / row["images_per_s"]
        row["evaluations_per_hour_incl_overhead"] = 3600.0 * row["k"] / (train_s + overhead)
    return row


def evaluations_per_hour(images_per_s: float) -> float:
    """Evaluations of the paper's size (FITNESS.epochs x 45,000 training images) an hour at this rate."""
    return 3600.0 * images_per_s / (FITNESS.epochs * PAPER_TRAIN)


def full_evaluation(args, data: Dataset, res: dict) -> dict:
    """One whole evaluation on the generated images, timed from a new genome to its last validation;
    ``res["full_evaluation"]`` holds the epochs done so far (and ``progress`` prints it) after each.

    With --triton, as a search worker's later candidate: the first genome's model is built and stepped
    once (compiles, capture) before the clock starts at ``set_genome`` of the timed genome on it."""
    sync(data.device)
    t0 = time.perf_counter()
    loop = StepLoop(data, args.genome if args.triton else args.full_genome, True, loop_options(args), ragged=True)
    clock = "from building the model in this process"
    if args.triton:
        loop.run(1)
        t0 = time.perf_counter()
        loop.new_genome(args.full_genome)
        loop.pos = 0  # the timed genome's first epoch starts here
        clock = "from set_genome on a model that trained one step of another genome (a search worker's later candidate)"
    for epoch in range(1, args.full_epochs + 1):
        loop.run(loop.per_epoch)
        acc = evaluate(loop.model, data, data.val_x, data.val_y)[0]
        sync(data.device)
        res["full_evaluation"] = {"seconds": time.perf_counter() - t0, "epochs_done": epoch,
                                  "genome": args.full_genome, "train_images": len(data.train_y),
                                  "val_images": len(data.val_y), "epochs": args.full_epochs, "steps": loop.pos,
                                  "last_val_acc": acc, "clock": clock}
        progress(res)
    return res["full_evaluation"]


def measure_all(args) -> dict:
    """Every number of the report, in the order the text prints them."""
    device = torch.device(args.device)
    setup_backend(device)
    data = synthetic_data(args.images, device)
    res = {"host": machine(), "device": args.device,
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "genome": args.genome, "new_genome": args.new_genome,
           "settings": {"model": args.model, "epochs": FITNESS.epochs, "batch": args.batch, "lr": FITNESS.lr,
                        "images": args.images, "train_images": len(data.train_y), "val_images": len(data.val_y),
                        "steps": args.steps, "warmup": args.warmup, "compile": args.compile,
                        "compile_backend": args.compile_backend if args.compile else None,
                        "measure_op": args.measure_op, "fused_adam": args.fused_adam, "cudagraphs": args.cudagraphs,
                        "triton": args.triton, "graphs": args.graphs, "counts": args.counts, "step": step_kind(args)}}
    if args.full_only:
        full_evaluation(args, data, res)
        return res
    res["first_step_s"] = first_steps(args, data)
    progress(res)
    binary_rate, step_s, loop = throughput(args, data, True)
    val_s = validation_s(loop)
    del loop
    float_rate = None if args.no_float else throughput(args, data, False)[0]
    res.update(binary_images_per_s=binary_rate, float_images_per_s=float_rate,
               binary_vs_float=binary_rate / float_rate if float_rate else None, step_s=step_s, validation_s=val_s)
    res.update(extrapolate(args, res, step_s, val_s))
    _free(device)
    res["concurrent"], res["best_k"] = [], None
    progress(res)
    # What an evaluation costs beyond its training steps (validation, a new genome's set-up), measured alone.
    overhead = res["evaluation_s"] - FITNESS.epochs * math.ceil(PAPER_TRAIN / args.batch) * step_s
    for k in args.k:
        res["concurrent"].append(_with_overhead(concurrent(args, k), overhead))
        ok = [r for r in res["concurrent"] if "images_per_s" in r]
        res["best_k"] = max(ok, key=lambda r: r["images_per_s"])["k"] if ok else None
        progress(res)
    res["in_process"] = []
    for k in args.streams:
        try:
            row = in_process(args, data, k)
        except RuntimeError as exc:  # out of memory at a large K, say: the rows so far still count
            _free(device)
            row = {"k": k, "error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}
        res["in_process"].append(_with_overhead(row, overhead))
        progress(res)
    if args.full:
        full_evaluation(args, data, res)
    return res


def progress(res: dict) -> None:
    """The numbers so far as one stderr line, so a run stopped by a timeout still leaves them."""
    print("progress " + json.dumps(res, separators=(",", ":")), file=sys.stderr, flush=True)


def extrapolate(args, res: dict, step_s: float, val_s: float) -> dict:
    """Seconds per evaluation of the paper's size from the measured step and validation, and the formula used."""
    mode = step_kind(args)
    setup = max(0.0, res["first_step_s"][mode]["new_genome"] - step_s)
    steps = math.ceil(PAPER_TRAIN / args.batch)
    val_paper = val_s * PAPER_VAL / res["settings"]["val_images"]
    total = setup + FITNESS.epochs * (steps * step_s + val_paper)
    text = (f"{setup:.2f} s new-genome set-up ({mode} first step less one step) + {FITNESS.epochs} epochs x "
            f"({steps} steps x {1e3 * step_s:.1f} ms + {val_paper:.2f} s validating {PAPER_VAL} images)")
    return {"evaluation_s": total, "evaluation_extrapolated": True, "extrapolation": text}


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the K processes get the memory this one no longer uses


def main(argv=None) -> int:
    """Run the benchmark; 0, or 2 with one ``error:`` line for a refused command line."""
    args, code = build_parser().parse(argv)
    if args is None:
        return code
    try:
        args = resolve(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res = measure_all(args)
    print(json.dumps(res, separators=(",", ":")) if args.json else report(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
