"""``python -m refimpl.infer MODEL.bnn``: CPU inference of an exported BNN, without PyTorch.

Inputs (one of):

* ``--input X.npy``: uint8 images ``(N, H, W, C)`` (HWC, as images are stored), or float32
  ``(N, C, H, W)`` in the same raw pixel units (0..255 for CIFAR, 0..16 for digits). Both are
  normalized with the model's ``(pixel - mean[c]) / std[c]``. With ``--normalized`` a float32
  NCHW array is taken as already normalized and fed to the network as is.
  ``--labels Y.npy`` (integers, one per image) adds an accuracy.
* ``--dataset NAME [--data-dir DIR] [--download]``: the test split of a data set, the one
  ``bnn.train`` reports on: ``digits`` (embedded), ``mnist`` and ``fashion-mnist`` (the IDX
  files; ``--download`` fetches them), ``cifar10`` and ``cifar100`` (the Python archives).
  DIR defaults to ``$BNN_DATA_DIR`` or ``./data``. A data set whose image shape or class count
  differs from the model's is refused.
* ``--cifar DIR`` and ``--digits``: older spellings of ``--dataset cifar10|cifar100 --data-dir
  DIR`` (the archive matching the model's classes) and ``--dataset digits``.

Or ``--summary``: the model's layers and what each costs (``summary.py``), without running it.

Prints a summary; with ``--json`` the last stdout line is one JSON object with ``n``,
``accuracy`` (null without labels), ``images_per_s`` (the whole input at ``--batch``),
``latency_ms_batch1`` (median over single images) and the settings. ``--out preds.npy`` saves the
predicted class indices (int64), -1 for an image whose logits are not finite. Errors are one
line on stderr and exit status 2; non-finite logits are reported on stdout and exit status 1.
Images are normalized and run a batch at a time (memory does not grow with the image count
beyond the input as stored).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..cli import OneLineParser, one_line, positive_int
from ..datasets import DATASETS, dataset_arg
from ..fileio import atomic_file, check_output

LATENCY_IMAGES = 20  # single-image runs for the batch-1 latency median


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m refimpl.infer",
                description="Run an exported binarized network (a .bnn file from python -m bnn.export) on the CPU, "
                            "with NumPy and Numba only.")
    p.add_argument("model", help="MODEL.bnn written by python -m bnn.export")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", metavar="X.npy",
                     help="uint8 (N, H, W, C) images, or float32 (N, C, H, W) in raw pixel units")
    src.add_argument("--dataset", type=dataset_arg, metavar="{" + ",".join(DATASETS) + "}",
                     help="run the test split of this data set (the one bnn.train reports on)")
    src.add_argument("--cifar", metavar="DIR", help="same as --dataset cifar10|cifar100 --data-dir DIR")
    src.add_argument("--digits", action="store_true", help="same as --dataset digits")
    src.add_argument("--summary", action="store_true",
                     help="print the model's layers and what each costs (1-bit and 32-bit MACs, measure evaluations, "
                          "parameter bytes) instead of running it")
    p.add_argument("--data-dir", metavar="DIR", help="folder holding the data set's files (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true", help="with --dataset mnist|fashion-mnist: fetch missing files "
                                                            "(official mirrors, SHA-256 checked)")
    p.add_argument("--labels", metavar="Y.npy", help="integer labels for --input, to report accuracy")
    p.add_argument("--normalized", action="store_true", help="--input is float32 NCHW already normalized")
    p.add_argument("--batch", type=positive_int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--threads", type=positive_int, help="Numba threads (default: all cores)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout")
    p.add_argument("--out", metavar="PREDS.npy", help="save predicted class indices (int64)")
    return p


def _load_npy(path: str, what: str, mmap: bool = False) -> np.ndarray:
    """The array of a ``.npy`` file; ``mmap``: mapped, not read, so images are read a batch at a
    time (and a header that claims more than the file holds is refused, not allocated)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file {path!r} does not exist")
    try:
        x = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError, MemoryError) as exc:
        raise ValueError(f"{what} file {path} is not a readable .npy array ({' '.join(str(exc).split())})") from None
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} file {path} is not a .npy array")
    return x


def _test_split(name: str, data_dir: str | None, download: bool, model):
    """(images, labels, description) of a data set's test split, refused up front when its images
    or classes cannot be the model's. ``name`` "cifar": the archive of the model's classes. The
    images are uint8 NCHW, or for the IDX sets a ``datasets.IdxReader`` that reads them in batches."""
    from .. import datasets

    key = name if name == "cifar" else datasets.canonical_name(name)
    shape = datasets.INPUT_SHAPES["cifar10" if key == "cifar" else key]
    if tuple(model.input_shape) != shape:
        raise ValueError(f"{model.path} takes {'x'.join(map(str, model.input_shape))} images, {key} has "
                         f"{'x'.join(map(str, shape))}; use a model trained on {key}")
    if download and key not in datasets.IDX:
        raise ValueError(f"--download fetches mnist and fashion-mnist only; get {key} from "
                         f"{datasets.CIFAR_URL if key != 'digits' else 'scikit-learn (it ships digits)'}")
    data_dir = data_dir if data_dir is not None else os.environ.get("BNN_DATA_DIR", "data")
    if key == "digits":
        images, labels, names = datasets.digits_test()
        where = "digits test split"
    elif key in datasets.IDX:
        images, labels, names = datasets.mnist_test_stream(key, data_dir, download)
        where = f"{key} test split in {data_dir}"
    else:
        classes = model.num_classes if key == "cifar" else datasets.CIFAR[key].num_classes
        images, labels, names = datasets.cifar_test(data_dir, classes)
        where = f"CIFAR test split in {data_dir}"
    if len(names) != model.num_classes:
        raise ValueError(f"{model.path} has {model.num_classes} classes, {key} has {len(names)}; use a model trained on {key}")
    trained_on = model.meta.get("dataset")
    if trained_on and key != "cifar" and trained_on != key:
        print(f"note: {model.path} was trained on {trained_on}, running it on {key}", file=sys.stderr)
    return images, labels, where


def _inputs(args, model):
    """(``batches(size)``: the images in order, ``size`` at a time, normalized float32 NCHW; the
    image count; labels or None; description). Memory holds one batch in float32 whatever the
    image count: an IDX file is read a batch at a time, a .npy file is mapped, not read."""
    if args.dataset or args.digits or args.cifar:
        name = args.dataset or ("digits" if args.digits else "cifar")
        images, labels, where = _test_split(name, args.cifar or args.data_dir, args.download, model)
        if isinstance(images, np.ndarray):
            def parts(size):
                return (images[i:i + size] for i in range(0, len(images), size))
        else:
            parts = images.batches
        c, h, w = model.input_shape
        return ((lambda size: (model.preprocess(p.reshape(-1, c, h, w).astype(np.float32)) for p in parts(size))),
                len(images), labels, where)
    x = _load_npy(args.input, "--input", mmap=True)
    if args.normalized:
        def take(i, j):
            return model.check_input(np.array(x[i:j]))
    else:
        def take(i, j):
            return model.preprocess(np.array(x[i:j]))
    if x.ndim < 1 or len(x) == 0:
        raise ValueError(f"--input {args.input} holds no images (shape {x.shape})")
    take(0, 1)  # a wrong dtype or shape is refused here, before anything runs
    labels = None
    if args.labels:
        labels = _load_npy(args.labels, "--labels", mmap=True)
        if labels.ndim != 1 or len(labels) != len(x) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"--labels must be {len(x)} integers (one per image), got {labels.dtype} {labels.shape}")
        if labels.min() < 0 or labels.max() >= model.num_classes:
            raise ValueError(f"--labels must lie in 0..{model.num_classes - 1}")
        labels = np.array(labels)  # as many as the images: read now
    return (lambda size: (take(i, i + size) for i in range(0, len(x), size))), len(x), labels, args.input


def _run_batches(model, batches, n: int) -> tuple[np.ndarray, float, np.ndarray]:
    """(logits of all ``n`` images, the seconds the network took on them, the first
    LATENCY_IMAGES images for the batch-1 latency), the batches run in order."""
    logits = np.empty((n, model.num_classes), dtype=np.float32)
    elapsed, i, head = 0.0, 0, []
    for x in batches:
        if i == 0:  # warm up: loads the compiled kernels from Numba's cache, or compiles them
            model.run(x[:1])
            model.run(x)
        t0 = time.perf_counter()  # the network's time: normalizing a batch is not timed
        logits[i:i + len(x)] = model.run(x)
        elapsed += time.perf_counter() - t0
        if i < LATENCY_IMAGES:
            head.append(x[:LATENCY_IMAGES - i])
        i += len(x)
    return logits, elapsed, np.concatenate(head)


def run(args) -> dict:
    """Run the model on the inputs ``args`` names and return the summary ``--json`` prints.

    A bad option or input is a one-line ValueError before the model runs; the predictions go to
    ``--out`` atomically; it times a batched pass and single-image latency.
    """
    import numba

    from .. import isa
    from .model import load

    if (args.data_dir is not None or args.download) and args.dataset is None:
        raise ValueError("--data-dir and --download go with --dataset NAME")
    for flag, given in (("--labels", args.labels is not None), ("--normalized", args.normalized)):
        if given and args.input is None:  # a data set brings its own labels and normalization
            raise ValueError(f"{flag} goes with --input X.npy, not with a data set (--dataset, --digits, --cifar)")
    if args.batch < 1:
        raise ValueError(f"--batch must be at least 1, got {args.batch}")
    if args.threads is not None:
        if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
            raise ValueError(f"--threads must be in 1..{numba.config.NUMBA_NUM_THREADS}, got {args.threads}")
        numba.set_num_threads(args.threads)
    if args.out:  # before any work: not a folder, FIFO or device, not the model or the input
        check_output(args.out, [args.model, args.input, args.labels])
    model = load(args.model)
    batches, n, labels, source = _inputs(args, model)
    logits, elapsed, head = _run_batches(model, batches(args.batch), n)
    single = []
    for i in range(len(head)):
        t = time.perf_counter()
        model.run(head[i:i + 1])
        single.append(time.perf_counter() - t)

    finite = np.isfinite(logits).all(axis=1)
    # An image whose logits are not all finite gets no class: -1 in --out, never argmax's guess.
    preds = np.where(finite, logits.argmax(axis=1), -1).astype(np.int64)
    accuracy = None
    if labels is not None:
        # Non-finite logits count as wrong (bnn.train.evaluate does the same).
        accuracy = float(((preds == labels) & finite).mean())
    if args.out:
        with atomic_file(args.out) as f:  # a file object: np.save adds no ".npy" to the name
            np.save(f, preds)
    return {
        "n": n,
        "accuracy": accuracy,
        "images_per_s": n / elapsed if elapsed > 0 else None,
        "latency_ms_batch1": 1e3 * float(np.median(single)),
        "batch": args.batch,
        "threads": numba.get_num_threads(),
        "isa_path": isa.current_path(),  # the kernel path (refimpl/isa.py; REFIMPL_ISA forces one)
        "model": args.model,
        "arch": model.meta.get("arch"),
        "genome": str(model.genome),
        "downsample": model.downsample,
        "counts": model.counts,
        "source": source,
        "nonfinite": int((~finite).sum()),
    }


def describe_costs(args) -> dict:
    """``--summary``: print the model's layers and costs (``summary.py``); the ``--json`` object."""
    from . import summary
    from .model_file import describe, read

    given = [flag for flag, v in (("--out", args.out), ("--labels", args.labels), ("--normalized", args.normalized),
                                  ("--data-dir", args.data_dir), ("--download", args.download)) if v]
    if given:
        raise ValueError(f"{given[0]} goes with running the model; --summary only reads the file")
    d = describe(*read(args.model), args.model)
    print(summary.text(d, summary.title(d, args.model)), end="")
    table = summary.rows(d)
    return {"model": args.model, "arch": d.arch, "genome": str(d.genome), "downsample": d.downsample, "counts": d.counts,
            "input_shape": list(d.input_shape), "layers": table, "totals": summary.totals(table)}


def main(argv=None) -> int:
    """``python -m refimpl.infer``: 0, or 2 with one ``error:`` line for a refused input."""
    args, status = _parser().parse(argv)
    if args is None:
        return status
    if args.summary:
        try:
            costs = describe_costs(args)
        except (ValueError, OSError) as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(costs))
        return 0
    try:
        summary = run(args)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # an allocation the plan's bound (engine/budget.py) did not foresee
        print(f"error: out of memory ({one_line(exc) or 'no detail'}); try a smaller --batch, or a machine with "
              "more memory", file=sys.stderr)
        return 2
    acc = "n/a (no labels)" if summary["accuracy"] is None else f"{100 * summary['accuracy']:.2f}%"
    print(f"{summary['arch']} ({summary['genome']}, {summary['downsample']} downsampling, {summary['counts']} counts) "
          f"on {summary['n']} images "
          f"from {summary['source']}: "
          f"accuracy {acc}; {summary['images_per_s']:.0f} images/s at batch {summary['batch']}, "
          f"batch-1 latency {summary['latency_ms_batch1']:.3f} ms, {summary['threads']} threads")
    if summary["nonfinite"]:  # on stdout, with the result it qualifies; and a failing status
        print(f"error: {summary['nonfinite']} of {summary['n']} images have non-finite logits (inf or NaN): the model "
              "diverged or overflows on them; they get no class (-1 in --out) and count as wrong")
    if args.json:
        print(json.dumps(summary))
    return 1 if summary["nonfinite"] else 0


if __name__ == "__main__":
    sys.exit(main())
