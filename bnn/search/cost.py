"""Where a search's time went, and whether its short-budget fitness ranks measures as a longer recipe does.

    python -m bnn.search.cost RUN_DIR                               # the cost of the search in RUN_DIR
    python -m bnn.search.cost RUN_DIR --full ROOT                   # + rank correlation with an evidence grid
    python -m bnn.search.cost RUN_DIR --full ROOT --screen ROOT2 --score

The cost comes from the journal alone: how many evaluations were trained, answered by the cache,
by a functionally equal measure, by screening, rejected early or diverged, and the seconds a
training took (a worker's wall time, ``wall_s`` in each result).

The rank correlation pairs every measure of an evidence grid (``bnn.evidence``; ``--full``: its
``results.json``, per measure and count convention) with its fitness under the search's own
training settings (the convention overridden by the grid cell's): taken from the journal where the
search trained it, else from ``RUN_DIR/fitness-extra.jsonl``; ``--score`` trains the missing ones
there, one journaled line each, so an interrupted scoring continues. ``--screen`` pairs a second
grid (a shorter protocol) with the ``--full`` one. Spearman's rho with average ranks for ties.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from refimpl.cli import OneLineParser, one_line
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.fileio import OutputError, read_regular
from refimpl.genome import Genome

from ..common.jsonl import append_line, cut_to, is_accuracy, is_number
from ..common.runlock import RunDirInUse, hold_run_dir
from ..common.stats import bootstrap_spearman, mean, spearman, split_half, split_half_text, top_agreement
from .journal import JOURNAL, JournalError, read
from .loop import SearchConfig

EXTRA = "fitness-extra.jsonl"
_TRAINED = "train"


class CostError(ValueError):
    """A refused input: one ``error:`` line, exit status 2."""


def _genome(v) -> str | None:
    """The canonical text of a genome field, or None if it is not one."""
    if not isinstance(v, str):
        return None
    try:
        return str(Genome.parse(v))
    except ValueError:
        return None


def _show(v) -> str:
    return repr(v)[:40]


def check_events(path, events: list[dict]) -> str:
    """The journal's count convention, once every field this command reads has its type: a
    ``time`` (seconds), a result's ``genome``, and a trained result's ``fitness`` (an accuracy in
    0..1) and ``wall_s``; else a ``CostError`` naming the line and the field."""
    counts = events[0]["config"].get("counts", "raw")  # a journal from before conventions trained raw
    if counts not in COUNT_CONVENTIONS:
        raise CostError(f"{path}: line 1 has config.counts {_show(counts)}, not one of {', '.join(COUNT_CONVENTIONS)}; "
                        "not a journal this version wrote")
    for i, e in enumerate(events, 1):
        bad = None
        if e.get("time") is not None and not is_number(e.get("time")):
            bad = f"time {_show(e.get('time'))}, not a number of seconds"
        elif e.get("type") == "result":
            if _genome(e.get("genome")) is None:
                bad = f"a result whose genome is {_show(e.get('genome'))}, not a genome"
            elif e.get("source") == _TRAINED and e.get("fitness") is not None and not is_accuracy(e.get("fitness")):
                bad = f"a trained result whose fitness is {_show(e.get('fitness'))}, not an accuracy in 0..1"
            elif e.get("source") == "ladder" and not (is_number(e.get("fitness")) and e["fitness"] >= 0):
                bad = f"a ladder's result whose fitness is {_show(e.get('fitness'))}, not a rung plus a score"
            elif e.get("wall_s") is not None and not (is_number(e.get("wall_s")) and e["wall_s"] >= 0):
                bad = f"a result whose wall_s is {_show(e.get('wall_s'))}, not a number of seconds"
        if bad:
            raise CostError(f"{path}: line {i} has {bad}; not a journal the search wrote")
    return counts


def _segments_wall(events: list[dict]) -> float:
    """Wall seconds the search ran: per start/resume segment, its first to its last timed event."""
    total, first, last = 0.0, None, None
    for e in events:
        t = e.get("time")
        if e.get("type") in ("start", "resume"):
            if first is not None and last is not None:
                total += last - first
            first, last = t, t
        elif isinstance(t, (int, float)) and math.isfinite(t):
            last = t
    if first is not None and last is not None:
        total += last - first
    return total


def cost(events: list[dict]) -> dict:
    """Counts of each way an evaluation was answered, and the trainings' seconds by outcome."""
    results = [e for e in events if e.get("type") == "result"]
    by_source: dict[str, int] = {}
    for r in results:
        by_source[str(r.get("source"))] = by_source.get(str(r.get("source")), 0) + 1
    trained = [r for r in results if r.get("source") == _TRAINED]
    outcomes: dict[str, dict] = {}
    for status in sorted({str(r.get("status")) for r in trained}):
        secs = [float(r["wall_s"]) for r in trained if str(r.get("status")) == status
                and isinstance(r.get("wall_s"), (int, float))]
        outcomes[status] = {"n": len(secs), "median_s": statistics.median(secs) if secs else None, "mean_s": mean(secs), "total_s": sum(secs)}
    train_s = sum(o["total_s"] for o in outcomes.values())
    wall = _segments_wall(events)
    out = {"evaluations": len(results), "trainings": len(trained), "by_source": by_source,
           "trained_by_status": outcomes, "training_s": train_s, "wall_s": wall,
           "evaluations_per_hour": 3600.0 * len(results) / wall if wall > 0 else None}
    rungs = ladder_cost(events)
    if rungs:  # a ladder search (bnn/search/ladder.py): its trainings are its rung and reference lines
        out.update(ladder=rungs, trainings=sum(r["trained"] for r in rungs) + sum(r["references"] for r in rungs),
                   training_s=sum(r["training_s"] for r in rungs))
        out["training_s_per_candidate"] = out["training_s"] / len(results) if results else None
    return out


def _secs(e: dict) -> float:
    v = e.get("wall_s")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0


def ladder_cost(events: list[dict]) -> list[dict]:
    """Per rung of a ladder search: trainings and cache answers, how many candidates ended there or
    above, XNOR's references and the seconds all of them took; [] for an Algorithm 1 journal."""
    lines = [e for e in events if e.get("type") in ("rung", "reference") and isinstance(e.get("rung"), int)]
    if not lines:
        return []
    ends = [e["rung"] for e in events if e.get("type") == "result" and isinstance(e.get("rung"), int)]
    out = []
    for r in range(max(e["rung"] for e in lines) + 1):
        mine = [e for e in lines if e["rung"] == r]
        trained = [e for e in mine if e["type"] == "rung" and e.get("source") == _TRAINED]
        refs = [e for e in mine if e["type"] == "reference"]
        out.append({"rung": r, "trained": len(trained), "cached": sum(e["type"] == "rung" for e in mine) - len(trained),
                    "references": len(refs), "reached": sum(x >= r for x in ends),
                    "median_s": statistics.median([_secs(e) for e in trained]) if trained else None,
                    "training_s": sum(_secs(e) for e in trained + refs)})
    return out


def _key(genome: str, counts: str) -> str:
    return f"{genome}/{counts}"


def journal_fitness(events: list[dict], counts: str) -> dict[str, float]:
    """Fitness per genome/convention of every training the search ran itself (``check_events``
    has checked the fields)."""
    out = {}
    for r in events:
        if r.get("type") == "result" and r.get("source") in (_TRAINED, "ladder") and r.get("fitness") is not None:
            out[_key(_genome(r["genome"]), counts)] = float(r["fitness"])
    return out


def _extra_problem(rec) -> str | None:
    """What makes a line of fitness-extra.jsonl not a record ``score_missing`` wrote, or None."""
    if not isinstance(rec, dict):
        return f"is {type(rec).__name__}, not a fitness record"
    genome, counts = _genome(rec.get("genome")), rec.get("counts")
    if genome is None:
        return f"has genome {_show(rec.get('genome'))}, not a genome"
    if counts not in COUNT_CONVENTIONS:
        return f"has counts {_show(counts)}, not one of {', '.join(COUNT_CONVENTIONS)}"
    if rec.get("key") != _key(genome, counts):
        return f"has key {_show(rec.get('key'))}, which contradicts its genome and counts ({_key(genome, counts)})"
    if rec.get("fitness") is not None and not is_accuracy(rec.get("fitness")):
        return f"has fitness {_show(rec.get('fitness'))}, not an accuracy in 0..1"
    return None


def read_extra(run_dir: Path, log=None, cut: bool = False) -> dict[str, dict]:
    """The extra fitness trainings journaled by ``--score``, each record checked. A torn last
    line (a kill or a full disk in the middle of an append) is dropped and named, and with
    ``cut`` (the caller holds the run folder's lock, so no append is under way) cut off, so the
    next record starts on a line of its own; its training is then simply done again."""
    path = run_dir / EXTRA
    if not path.exists() and not path.is_symlink():
        return {}
    out = {}
    raw = read_regular(path)
    lines, good_end = raw.split(b"\n"), 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if last and not line:
            break
        try:
            rec = json.loads(line)
            if last:  # whole JSON but no newline: the write stopped before its end
                raise ValueError
        except (ValueError, RecursionError):
            if not (last or (i == len(lines) - 2 and not lines[-1])):
                raise CostError(f"{path}: line {i + 1} is not JSON; move the file away to score again") from None
            if log:
                log(f"{path}: ignored a torn last line{' (cut off; its training runs again)' if cut else ''}")
            if cut:
                cut_to(path, good_end)
            break
        problem = _extra_problem(rec)
        if problem:
            raise CostError(f"{path}: line {i + 1} {problem}; move the file away to score again")
        out[rec["key"]] = rec
        good_end += len(line) + 1
    return out


def _extra_fitness(records: dict[str, dict]) -> dict[str, float]:
    return {k: float(r["fitness"]) for k, r in records.items() if r.get("fitness") is not None}


def grid_rows(root: str, unranked: list[str] | None = None) -> list[dict]:
    """The rows of an evidence grid's results.json that trained at least once, each checked
    (genome, counts, n_ok, test_mean), genomes canonical; ``unranked`` (if given) gets the label of
    each row left out because none of its cells finished ok (all diverged: no accuracy to rank)."""
    path = Path(root) / "results.json"
    try:
        data = json.loads(read_regular(path))
    except FileNotFoundError:
        raise CostError(f"{path}: no such file; run `python -m bnn.evidence --root {root}` (or --table-only) first") from None
    except (ValueError, RecursionError):
        raise CostError(f"{path}: not JSON; rewrite it with `python -m bnn.evidence --root {root} --table-only`") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise CostError(f"{path}: no rows; not an evidence grid's results.json")
    out = []
    for i, r in enumerate(rows):
        bad = None
        if not isinstance(r, dict):
            bad = f"is {type(r).__name__}, not an object"
        elif not isinstance(r.get("n_ok"), int) or isinstance(r.get("n_ok"), bool) or r["n_ok"] < 0:
            bad = f"has n_ok {_show(r.get('n_ok'))}, not a count of runs"
        elif r["n_ok"] == 0:
            if unranked is not None:
                unranked.append(_label(r))
            continue  # no cell finished ok: nothing to rank
        elif _genome(r.get("genome")) is None:
            bad = f"has genome {_show(r.get('genome'))}, not a genome"
        elif r.get("counts", "raw") not in COUNT_CONVENTIONS:
            bad = f"has counts {_show(r.get('counts'))}, not one of {', '.join(COUNT_CONVENTIONS)}"
        elif not is_accuracy(r.get("test_mean")):
            bad = f"has test_mean {_show(r.get('test_mean'))}, not an accuracy in 0..1"
        if bad:
            raise CostError(f"{path}: row {i + 1} {bad}; rewrite it with `python -m bnn.evidence --root {root} --table-only`")
        out.append({**r, "genome": _genome(r["genome"])})
    return out


def grid_cell_seconds(root: str, clock: str = "wall_s") -> float | None:
    """The mean training seconds of one cell of an evidence grid on ``clock`` (its results.json's wall_s
    or cpu_s over its cells), or None where the file does not say (CPU seconds: unless every cell has
    them): what a candidate's cost is compared with."""
    try:
        data = json.loads(read_regular(Path(root) / "results.json"))
        secs, n = data[clock]["cells"], data["cells_done"]
        if clock == "cpu_s" and data[clock]["cells_counted"] != n:
            return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (secs, n))
    return secs / n if ok and n > 0 and secs > 0 else None


def _label(row: dict) -> str:
    return f"{row.get('measure')} {row.get('counts', 'raw')}"


def rank_table(full: list[dict], short: dict[str, float]) -> tuple[list[dict], float | None]:
    """Rows with both a full-recipe mean and a short-budget score, and Spearman's rho over them."""
    pairs = []
    for r in full:
        k = _key(r["genome"], r.get("counts", "raw"))
        if k in short:
            pairs.append({"cell": _label(r), "genome": r["genome"], "counts": r.get("counts", "raw"),
                          "short": short[k], "full": r["test_mean"], "full_n": r["n_ok"]})
    rho = spearman([p["short"] for p in pairs], [p["full"] for p in pairs]) if len(pairs) >= 3 else None
    return pairs, rho


def score_missing(run_dir: Path, config: dict, rows: list[dict], known: dict[str, float], log) -> None:
    """Train, under the search's settings, every grid measure that has no fitness yet."""
    from .fitness import Worker, fitness_of

    cfg = SearchConfig.from_mapping(config)
    todo = [r for r in rows if _key(r["genome"], r.get("counts", "raw")) not in known]
    workers: dict[str, Worker] = {}
    for i, r in enumerate(todo, 1):
        counts = r.get("counts", "raw")
        train = dict(cfg.train_dict(), counts=counts)
        worker = workers.setdefault(counts, Worker(cfg.fitness, train))
        log(f"[{i}/{len(todo)}] scoring {_label(r)} ({r['genome']}) under the search's training settings")
        res = worker.run({"genome": r["genome"], "reject_below": None})
        fit = fitness_of(res)
        rec = {"key": _key(r["genome"], counts), "genome": r["genome"], "counts": counts,
               "fitness": fit if math.isfinite(fit) else None, "status": res.get("status"),
               "val_acc_per_epoch": res.get("val_acc_per_epoch"), "wall_s": res.get("wall_s")}
        append_line(str(run_dir / EXTRA), rec)
        if rec["fitness"] is not None:
            known[rec["key"]] = rec["fitness"]


def _s(v, digits=1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(c: dict, ranks: list[tuple[str, list[dict], float | None]]) -> str:
    """The cost tables and one table per rank correlation, as markdown."""
    lines = [f"{c['evaluations']} evaluations, {c['trainings']} trained; "
             f"{_s(c['wall_s'] / 60)} min of search wall time, {_s(c['training_s'] / 60)} min of worker time "
             f"({_s(c['evaluations_per_hour'])} evaluations an hour)", "",
             "| answered by | evaluations |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(c["by_source"].items(), key=lambda kv: -kv[1])]
    if c["trained_by_status"]:  # Algorithm 1's trainings; a ladder's are per rung, below
        lines += ["", "| trained, outcome | n | median s | mean s | total min |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {o['n']} | {_s(o['median_s'])} | {_s(o['mean_s'])} | {_s(o['total_s'] / 60)} |"
                  for k, o in c["trained_by_status"].items()]
    if c.get("cost_per_candidate"):
        k = c["cost_per_candidate"]
        lines += ["", f"Training per candidate: {_s(k['training_s'])} s, {_s(k['fraction_of_full'], 3)} of a full-recipe "
                      f"cell ({_s(k['full_recipe_cell_s'])} s, the --full grid's mean)"]
    if c.get("ladder"):
        lines += ["", f"A ladder: {_s(c['training_s_per_candidate'])} s of training per candidate", "",
                  "| rung | trained | from cache | XNOR references | candidates reaching it | median s | total min |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['rung']} | {r['trained']} | {r['cached']} | {r['references']} | {r['reached']} | "
                  f"{_s(r['median_s'])} | {_s(r['training_s'] / 60)} |" for r in c["ladder"]]
    for title, pairs, rho in ranks:
        lo, hi = bootstrap_spearman([p["short"] for p in pairs], [p["full"] for p in pairs])
        top = top_agreement([p["short"] for p in pairs], [p["full"] for p in pairs]) if len(pairs) > 3 else None
        agree = "" if top is None else f"; the top 3 agree on {top} of 3"
        lines += ["", f"{title}: Spearman rho = {_s(rho, 2)} [{_s(lo, 2)}, {_s(hi, 2)}, 95% bootstrap] over "
                      f"{len(pairs)} cells{agree}", "",
                  "| cell | genome | short | full test % | full runs |", "|---|---|---|---|---|"]
        lines += [f"| {p['cell']} | {p['genome']} | {100 * p['short']:.2f} | {100 * p['full']:.2f} | {p['full_n']} |"
                  for p in sorted(pairs, key=lambda p: -p["full"])]
    if c.get("full_split_half"):
        lines += ["", split_half_text(c["full_split_half"])]
    return "\n".join(lines) + "\n"


def rank_summary(title: str, pairs: list[dict], rho) -> dict:
    """A rank correlation as JSON: its pairs, rho, rho's 95% bootstrap interval and the top 3's agreement."""
    xs, ys = [p["short"] for p in pairs], [p["full"] for p in pairs]
    lo, hi = bootstrap_spearman(xs, ys)
    return {"title": title, "pairs": pairs, "rho": rho, "rho_ci": [lo, hi], "level": 0.95,
            "top3_agree": top_agreement(xs, ys) if len(pairs) > 3 else None}


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bnn.search.cost", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a search's folder (its journal.jsonl)")
    p.add_argument("--full", metavar="ROOT", help="an evidence grid (bnn.evidence --root) of the longer recipe")
    p.add_argument("--screen", metavar="ROOT", help="an evidence grid of a shorter protocol, ranked against --full")
    p.add_argument("--score", action="store_true",
                   help="train the --full grid's measures the search never trained, under its settings "
                        "(journaled in RUN_DIR/fitness-extra.jsonl)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    return p


def main(argv=None) -> int:
    """``python -m bnn.search.cost``: 0, or 2 with one ``error:`` line for a refused input."""
    args = _parser().parse_args(argv)
    run_dir = Path(args.run_dir)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.screen and not args.full:
            raise CostError("--screen is ranked against a --full grid; give --full ROOT too")
        if args.score and not args.full:
            raise CostError("--score trains the --full grid's measures; give --full ROOT too")
        try:
            events, _ = read(run_dir / JOURNAL)
        except FileNotFoundError:
            raise CostError(f"{run_dir / JOURNAL}: no such file; RUN_DIR must be a search's folder") from None
        config = events[0]["config"]
        counts = check_events(run_dir / JOURNAL, events)
        c = cost(events)
        ranks = []
        if args.full:
            full = grid_rows(args.full)
            known = journal_fitness(events, counts)
            if args.score:
                with hold_run_dir(run_dir, create=False):  # not while the search itself writes there
                    known.update(_extra_fitness(read_extra(run_dir, log, cut=True)))
                    score_missing(run_dir, config, full, known, log)
            else:
                known.update(_extra_fitness(read_extra(run_dir, log)))
            pairs, rho = rank_table(full, known)
            ranks.append(("search fitness vs full recipe", pairs, rho))
            paired = {(p["genome"], p["counts"]) for p in pairs}
            per_seed = [r.get("per_seed") for r in full if (r["genome"], r.get("counts", "raw")) in paired]
            c["full_split_half"] = split_half(per_seed) if all(isinstance(v, dict) for v in per_seed) else None
            cell_s, per = grid_cell_seconds(args.full), c["training_s"] / c["evaluations"] if c["evaluations"] else None
            c["cost_per_candidate"] = {"training_s": per, "full_recipe_cell_s": cell_s,
                                       "fraction_of_full": per / cell_s if per is not None and cell_s else None}
            if args.screen:
                short = {_key(r["genome"], r.get("counts", "raw")): r["test_mean"] for r in grid_rows(args.screen)}
                pairs, rho = rank_table(full, short)
                ranks.append(("screen vs full recipe", pairs, rho))
    except (CostError, JournalError, RunDirInUse, OutputError, ValueError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(markdown(c, ranks), end="")
    if args.json:  # strict JSON: every figure was checked finite on the way in
        print(json.dumps({"cost": c, "ranks": [rank_summary(t, p, r) for t, p, r in ranks]}, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
