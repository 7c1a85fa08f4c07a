"""Which fitness design ranks measures as the full recipe does: ``python -m bnn.search.calibrate``.

Every measure of an evidence grid with full-recipe results (``--full ROOT``: its results.json, per
measure and count convention) is trained on every rung of a ladder (``--rungs``, as ``bnn.search``
takes them) with that rung's seeds, and XNOR on raw counts beside it on the same budgets; then each
design is scored by how its values rank the measures against the full recipe's test means:

* ``rung R``: one training budget, the validation accuracy (the search's fitness today at R = 0);
* ``rung R paired``: the same minus XNOR's on the same seed and budget;
* ``ladder to R (paired)``: the search's ladder over rungs 0..R, promotions replayed offline through
  ``bnn.search.ladder.Ladder`` in the grid's order, so its cost is what the search would pay.

For each: Spearman's rho with a 95% bootstrap interval, how many of the full recipe's top 3 it also
puts in its top 3, and its training seconds per measure, also as a fraction of a full-recipe cell:
CPU seconds on a CPU (a niced training's wall time on a shared host says what else ran), wall seconds
on a GPU, or wherever a training or the grid has no CPU seconds recorded (journals from before them).
Under the table, where the grid's results.json has each cell's per-seed accuracies: the full recipe ranked
against itself (its seeds in two halves, every split), the ceiling a cheaper fitness's rho is read against.
Trainings are journaled in ``OUT/journal.jsonl`` (one line each, fsynced): a rerun continues, and
refuses settings that differ from the journal's first line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from refimpl.cli import OneLineParser, fraction, one_line, positive_float, positive_int, seed_int
from refimpl.fileio import read_regular

from ..common.jsonl import append_line, cut_to, is_number
from ..common.stats import bootstrap_spearman, mean, spearman, split_half, split_half_text, top_agreement
from ..settings import DEFAULT_MODEL, FITNESS, MEASURE_IMPLS
from .cost import CostError, grid_cell_seconds, grid_rows
from .ga import BASELINE
from .ladder import Ladder, ga_value, parse_rungs

JOURNAL = "journal.jsonl"
_KEYS = ("dataset", "model", "rungs", "train_seed", "batch_size", "lr", "val_size", "measure_impl", "promote", "fitness")


def _job_key(genome: str, counts: str, rung: int, seed: int) -> str:
    return f"{genome}/{counts}/r{rung}/s{seed}"


def read_journal(path: Path, log) -> tuple[dict | None, dict[str, dict]]:
    """(settings, trainings by key); a torn last line (a kill mid-write) is named and cut off."""
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return None, {}
    lines, good, records = raw.split(b"\n"), 0, []
    for i, line in enumerate(lines):
        if i == len(lines) - 1 and not line:
            break
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError
        except (ValueError, RecursionError):
            if i < len(lines) - 1:
                raise CostError(f"{path}: line {i + 1} is not a calibration record; move the file away") from None
            log(f"{path}: its last line is incomplete (a kill mid-write); it is dropped and trained again")
            cut_to(str(path), good)  # never through a link planted in the journal's place
            break
        records.append(rec)
        good += len(line) + 1
    if not records:
        return None, {}
    settings, done = records[0].get("settings"), {}
    if not isinstance(settings, dict):
        raise CostError(f"{path}: line 1 holds no settings; not a calibration journal")
    for i, rec in enumerate(records[1:], 2):
        if not isinstance(rec.get("key"), str):
            raise CostError(f"{path}: line {i} has no key; not a calibration journal")
        done[rec["key"]] = rec
    return settings, done


def _evaluator(fitness: str, train: dict, workers: int, device: str):
    """One worker in this process, or ``workers`` local worker processes: on CUDA spread over the visible GPUs
    (all on GPU N for ``cuda:N``), on the CPU sharing its cores, as ``bnn.search``'s pool places them."""
    from .evaluators import LocalPoolEvaluator, SerialEvaluator
    from .loop import visible_gpus

    if workers <= 1:
        return SerialEvaluator(fitness, train)
    gpus = []
    if device.startswith("cuda"):  # a pinned worker sees its GPU as cuda
        gpus, train = ([device.split(":", 1)[1]] if ":" in device else visible_gpus()), {**train, "device": "cuda"}
    return LocalPoolEvaluator(fitness, train, workers, gpus)


def train_all(out: Path, settings: dict, cells: list[dict], device: str, data_dir, log,
              workers: int = 1) -> dict[str, dict]:
    """Every (measure, rung, seed) training and XNOR's references not yet journaled, journaled one line each
    as it ends (``workers`` at once). A training's bits do not depend on which worker ran it, but on a CPU they
    depend on its thread count (the cores shared among the workers), so a CPU calibration keeps its ``workers``."""
    from .loop import SearchConfig

    path = out / JOURNAL
    saved, done = read_journal(path, log)
    if saved is None:
        out.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a torn first line
        append_line(str(path), {"settings": {**settings, "workers": workers}})
    elif {k: saved.get(k) for k in _KEYS} != {k: settings.get(k) for k in _KEYS}:
        differ = next(k for k in _KEYS if saved.get(k) != settings.get(k))
        raise CostError(f"{out} holds a calibration with {differ}={saved.get(differ)!r}, not {settings.get(differ)!r}; "
                        "use another --out (or the same options)")
    if not device.startswith("cuda") and saved is not None and saved.get("workers", 1) != workers:
        raise CostError(f"{out} was trained on the CPU with --workers {saved.get('workers', 1)}, not {workers}: a CPU "
                        "training's bits depend on its thread count; use the same --workers (or another --out)")
    from ..train.host import cpu_kind, host_info

    kind = cpu_kind(host_info(device))  # the processor kind: ranks from two kinds are not one calibration
    other = sorted({rec["kind"] for rec in done.values() if rec.get("kind") not in (None, kind)})
    if other:
        raise CostError(f"{out} holds trainings on {other[0]}, and this machine trains on {kind}: a calibration runs on "
                        "one kind of processor (training rounds differently per kind); use another --out")
    lad = Ladder(settings["rungs"], True, settings["promote"], settings["train_seed"])
    jobs = [(BASELINE, "raw", r, s) for r in range(len(settings["rungs"])) for s in lad.seeds(r)]
    jobs += [(c["genome"], c["counts"], r, s) for c in cells for r in range(len(settings["rungs"])) for s in lad.seeds(r)]
    jobs = list(dict.fromkeys(jobs))
    # A training that ended in error is no fact about its measure (evidence reruns such cells too): trained again.
    todo = [j for j in jobs if done.get(_job_key(*j), {}).get("status", "error") == "error"]
    log(f"{out}: {len(jobs) - len(todo)} of {len(jobs)} trainings journaled, {len(todo)} to train")
    train = SearchConfig(dataset=settings["dataset"], model=settings["model"], batch_size=settings["batch_size"],
                         lr=settings["lr"], val_size=settings["val_size"], measure_impl=settings["measure_impl"],
                         data_dir=data_dir, device=device).train_dict()
    evaluator = _evaluator(settings.get("fitness", "train"), train, workers, device)
    try:
        for seq, (genome, counts, r, s) in enumerate(todo):
            evaluator.submit({"seq": seq, "genome": genome, "reject_below": None,
                              "train": {**lad.train_of(r, s), "counts": counts}})
        finished = 0
        while finished < len(todo):
            for seq, res in evaluator.poll():
                genome, counts, r, s = todo[seq]
                rec = {"key": _job_key(genome, counts, r, s), "genome": genome, "counts": counts, "rung": r, "seed": s,
                       **{k: res.get(k) for k in ("status", "val_acc", "epochs", "wall_s", "cpu_s")}, "kind": kind}
                if res.get("status") == "error":
                    rec["error"] = one_line(res.get("error") or "no message")
                append_line(str(path), rec)
                done[rec["key"]] = rec
                finished += 1
                log(f"[{finished}/{len(todo)}] {genome} {counts} rung {r} seed {s}: {rec['status']}, "
                    f"val {rec['val_acc']}, {rec['wall_s'] or 0:.0f} s")
    finally:
        evaluator.close()
    failed = [rec for j in jobs if (rec := done[_job_key(*j)]).get("status") == "error"]  # this grid's trainings only
    if failed:
        raise CostError(f"{len(failed)} of {len(jobs)} trainings ended in error (the first, {failed[0]['key']}: "
                        f"{failed[0].get('error', 'no message')}); fix it and run the same command: they train again")
    return done


def _acc(rec: dict) -> float:
    v = rec.get("val_acc")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0


def designs(settings: dict, cells: list[dict], done: dict[str, dict], clock: str = "wall_s") -> list[dict]:
    """Each design's value per cell and its training seconds per cell on ``clock`` (wall_s or cpu_s;
    see the module docstring)."""
    rungs, lad0 = settings["rungs"], Ladder(settings["rungs"], True, settings["promote"], settings["train_seed"])
    rec = lambda g, c, r, s: done[_job_key(g, c, r, s)]  # noqa: E731
    secs = lambda g, c, r: sum(float(rec(g, c, r, s).get(clock) or 0.0) for s in lad0.seeds(r))  # noqa: E731
    out = []
    for r in range(len(rungs)):
        raw = [mean(_acc(rec(c["genome"], c["counts"], r, s)) for s in lad0.seeds(r)) for c in cells]
        paired = [mean(_acc(rec(c["genome"], c["counts"], r, s)) - _acc(rec(BASELINE, "raw", r, s))
                       for s in lad0.seeds(r)) for c in cells]
        cost = mean(secs(c["genome"], c["counts"], r) for c in cells)
        alone = ["--rungs", rung_text(rungs[r]), "--train-seed", str(settings["train_seed"])]
        out.append({"design": f"rung {r} ({_budget(rungs[r])})", "values": raw, "seconds": cost, "search_flags": alone})
        out.append({"design": f"rung {r} paired", "values": paired, "seconds": cost,
                    "search_flags": [*alone, "--paired"]})
    for top in range(1, len(rungs)):  # the ladder over rungs 0..top, replayed in the grid's order
        lad = Ladder(rungs[: top + 1], True, settings["promote"], settings["train_seed"])
        for r in range(top + 1):
            for s in lad.seeds(r):
                lad.on_reference(r, s, rec(BASELINE, "raw", r, s))
        values, spent = [], []
        for i, c in enumerate(cells):
            lad.start(i, c["genome"])
            cost, decision = 0.0, []
            while not decision or decision[0][0] == "promote":
                r = lad.runs[i]["rung"]
                cost += secs(c["genome"], c["counts"], r)
                for s in lad.seeds(r):
                    decision = lad.on_result(i, r, s, rec(c["genome"], c["counts"], r, s)) or decision
            values.append(ga_value(decision[0][2], decision[0][3], True))
            spent.append(cost)
        out.append({"design": f"ladder to rung {top} (paired)", "values": values, "seconds": mean(spent),
                    "search_flags": ["--rungs", ",".join(rung_text(x) for x in rungs[: top + 1]), "--paired",
                                     "--promote", repr(float(settings["promote"])),
                                     "--train-seed", str(settings["train_seed"])]})
    return out


def rung_text(rung: dict) -> str:
    """A rung as ``--rungs`` takes it: EPOCHS:IMAGES:SEEDS."""
    return f"{rung['epochs']}:{'all' if rung['train_size'] is None else rung['train_size']}:{rung['seeds']}"


def _budget(rung: dict) -> str:
    size = "all" if rung["train_size"] is None else f"{rung['train_size']:,}"
    return f"{rung['epochs']} epochs, {size} images, {rung['seeds']} seed{'s' if rung['seeds'] > 1 else ''}"


def cost_clock(device: str, done: dict[str, dict], cpu_cell_s: float | None) -> str:
    """cpu_s on a CPU where every training and the grid's cells recorded CPU seconds, else wall_s."""
    if device.startswith("cuda") or cpu_cell_s is None:
        return "wall_s"
    return "cpu_s" if all(is_number(rec.get("cpu_s")) for rec in done.values()) else "wall_s"


def calibration(settings: dict, cells: list[dict], done: dict[str, dict], cell_s: float | None,
                clock: str = "wall_s") -> list[dict]:
    """One row per design: rho and its bootstrap interval, the top 3's agreement, the cost on ``clock``
    (``cell_s``: a full-recipe cell's seconds on the same clock)."""
    full = [c["test_mean"] for c in cells]
    rows = []
    for d in designs(settings, cells, done, clock):
        lo, hi = bootstrap_spearman(d["values"], full)
        rows.append({"design": d["design"], "rho": spearman(d["values"], full), "rho_ci": [lo, hi],
                     "top3_agree": top_agreement(d["values"], full) if len(cells) > 3 else None,
                     "seconds_per_measure": d["seconds"],
                     "fraction_of_full": d["seconds"] / cell_s if cell_s else None, "values": d["values"],
                     "search_flags": d["search_flags"]})
    return rows


def decide(rows: list[dict], max_fraction: float = 0.25, min_rho: float = 0.8) -> dict:
    """The search's default by the rule docs/evidence.md section 5 fixed before any result: among the designs
    that cost at most ``max_fraction`` of a full-recipe cell per measure, the highest rho (the cheaper on a tie)
    if it is at least ``min_rho`` and above rung 0's (Algorithm 1's fitness); else Algorithm 1 stays (no design,
    no flags)."""
    stay = lambda reason: {"design": None, "reason": reason, "search_flags": []}  # noqa: E731
    rung0 = next((r["rho"] for r in rows if r["design"].startswith("rung 0 (")), None)
    if any(r["fraction_of_full"] is None for r in rows):
        return stay("no cost: the full-recipe grid records no cell seconds on this clock")
    eligible = [r for r in rows if r["rho"] is not None and r["fraction_of_full"] <= max_fraction]
    if not eligible:
        return stay(f"no design costs at most {max_fraction:g} of a full-recipe cell")
    best = min(eligible, key=lambda r: (-r["rho"], r["fraction_of_full"]))
    said = f"{best['design']}: rho {best['rho']:.2f} at {best['fraction_of_full']:.3f} of a full-recipe cell"
    if best["rho"] < min_rho:
        return stay(f"the best within the cost, {said}, is below rho {min_rho:g}")
    if rung0 is not None and not best["rho"] > rung0:
        return stay(f"the best within the cost, {said}, is not above rung 0's rho {rung0:.2f}")
    return {"design": best["design"], "reason": said, "search_flags": best["search_flags"]}


def markdown(rows: list[dict], cells: list[dict], clock: str = "wall_s") -> str:
    """The calibration table."""
    f = lambda v, n=2: "-" if v is None else f"{v:.{n}f}"  # noqa: E731
    lines = [f"Fitness designs against the full recipe over {len(cells)} cells (Spearman's rho, 95% bootstrap "
             "interval; the full recipe's top 3 found in the design's top 3; training seconds per measure, "
             f"{'CPU' if clock == 'cpu_s' else 'wall'} time)", "",
             "| design | rho | 95% interval | top 3 | s per measure | of a full-recipe cell |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['design']} | {f(r['rho'])} | [{f(r['rho_ci'][0])}, {f(r['rho_ci'][1])}] | "
              f"{'-' if r['top3_agree'] is None else r['top3_agree']} of 3 | {f(r['seconds_per_measure'], 1)} | "
              f"{f(r['fraction_of_full'], 3)} |" for r in rows]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bnn.search.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--full", required=True, metavar="ROOT", help="an evidence grid of the full recipe (bnn.evidence --root)")
    p.add_argument("--rungs", required=True, help="the ladder whose rungs are the designs, E:N[:K],... as bnn.search takes it")
    p.add_argument("--promote", type=fraction, default=1 / 3, help="the ladder's fraction promoted, in (0, 1] (default 1/3)")
    p.add_argument("--dataset", default="fashion-mnist", help="the data set (default fashion-mnist)")
    p.add_argument("--model", help="the network (default: the data set's)")
    p.add_argument("--data-dir", help="folder with the data set's files (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true", help="download the data set if it is missing, before any "
                   "training, as bnn.train (MNISTs: the official files, SHA-256 checked; CIFAR: torchvision)")
    p.add_argument("--train-seed", type=seed_int, default=100, help="the first rung seed (default 100, as the first search)")
    p.add_argument("--batch-size", type=positive_int, default=FITNESS.batch_size,
                   help=f"images per step of every rung (default {FITNESS.batch_size}, as bnn.search)")
    p.add_argument("--lr", type=positive_float, default=FITNESS.lr,
                   help=f"Adam learning rate of every rung (default {FITNESS.lr:g}, as bnn.search)")
    p.add_argument("--measure-impl", default="eager", choices=MEASURE_IMPLS,
                   help="the measure path (default eager; triton on CUDA: the Triton kernels, each step one CUDA graph)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="trainings at once, each in a worker process (default 1: in this process)")
    p.add_argument("--out", default="runs/calibration", help="the journal's folder (default runs/calibration)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object on the last line")
    p.add_argument("--fitness", default="train", help=argparse.SUPPRESS)  # testing: synthetic:SEED
    return p


def main(argv=None) -> int:
    """``python -m bnn.search.calibrate``: 0, or 2 with one ``error:`` line for a refused input."""
    args, code = _parser().parse(argv)
    if args is None:
        return code
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        from ..train import resolve_device

        device = str(resolve_device(args.device, args.dataset))  # no CUDA here: one line, before anything is written
        rungs = parse_rungs(args.rungs)
        if args.download:  # once here, not in each worker
            from ..data import read_arrays

            read_arrays(args.dataset, args.data_dir, True)  # None: $BNN_DATA_DIR or ./data, as every reader
        unranked: list[str] = []
        ranked = [r for r in grid_rows(args.full, unranked) if isinstance(r.get("genome"), str)]
        cells = [{"genome": r["genome"], "counts": r.get("counts", "raw"), "test_mean": r["test_mean"],
                  "measure": r.get("measure")} for r in ranked]
        per_seed = [r.get("per_seed") for r in ranked]
        reliability = split_half(per_seed) if all(isinstance(p, dict) for p in per_seed) else None
        if len(cells) < 3:
            raise CostError(f"{args.full}: {len(cells)} cells with results; a rank correlation needs at least 3")
        settings = {"dataset": args.dataset, "model": args.model or DEFAULT_MODEL.get(args.dataset, "mnist_net"),
                    "rungs": rungs, "train_seed": args.train_seed, "batch_size": args.batch_size, "lr": args.lr,
                    "val_size": None, "measure_impl": args.measure_impl, "promote": args.promote,
                    "fitness": args.fitness}
        done = train_all(Path(args.out), settings, cells, device, args.data_dir or os.environ.get("BNN_DATA_DIR"), log,
                         args.workers)
        clock = cost_clock(device, done, grid_cell_seconds(args.full, "cpu_s"))
        rows = calibration(settings, cells, done, grid_cell_seconds(args.full, clock), clock)
    except (CostError, ValueError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the trainings that ended are journaled in {args.out}; the same command continues",
              file=sys.stderr)
        return 130
    decision = decide(rows)
    print(markdown(rows, cells, clock), end="")
    if reliability:
        print("\n" + split_half_text(reliability))
    if unranked:
        print(f"\nLeft out of the ranking (every full-recipe cell diverged: no test accuracy): {', '.join(unranked)}.")
    print("\nDecision (docs/evidence.md section 5): "
          + (f"the search's default becomes {decision['reason']}" if decision["design"] else
             f"Algorithm 1's fitness stays the default; {decision['reason']}"))
    if decision["design"]:  # the design as the search runs it, so the second search cannot mistype it
        print("Search with it: python -m bnn.search " + " ".join(decision["search_flags"]))
    if args.json:
        print(json.dumps({"cells": cells, "unranked": unranked, "designs": rows, "clock": clock, "decision": decision,
                          "split_half": reliability},
                         allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
