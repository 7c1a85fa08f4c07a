"""Does the probe flag foretell late failure? The check fixed in docs/evidence.md section 5.

The flag: a measure that is not finite on some probe count tuple of the search's fitness
(``bnn.search.fitness.probe_outputs``) under its convention. Found after the calibration's results
on two cells, so a hypothesis; this script draws fresh measures and reads their full-recipe cells.

  python bench/probe_flag_check.py --plan              # the measures, drawn as the plan fixes
  python bench/probe_flag_check.py --read ROOT         # their cells in ROOT/journal.jsonl: the 2x2 and the test

--plan draws genomes uniformly (every code equally likely in every slot; numpy's PCG64 seeded 20261208)
that the search would train under raw counts (its screen passes them) and that no earlier experiment
trained, and keeps the first 8 flagged and the first 8 not flagged, in draw order. --read counts a
cell as failed when it diverged or its test accuracy is under 20% (chance is 10%), and gives Fisher's
exact test, one-sided (flagged measures fail more often).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from refimpl.cli import OneLineParser  # noqa: E402

SEED, PER_GROUP, COUNTS = 20261208, 8, "raw"
FAILED_BELOW = 0.20
# Trained on the full recipe before (docs/evidence.md sections 2-5): never drawn again.
EARLIER = ("16-4-4-12-10-4-2", "16-17-4-12-10-4-2", "16-7-11-12-1-12-2", "2-17-10-14-10-13-2",
           "2-17-10-2-10-0-2", "4-0-3-3-0-0-2")


def flagged(genome: str, counts: str = COUNTS) -> bool:
    """Not finite on some probe tuple of the search's fitness under ``counts``."""
    from bnn.search.fitness import probe_outputs

    return not bool(np.isfinite(probe_outputs(genome, counts)).all())


def plan() -> tuple[list[str], list[str]]:
    """(flagged, not flagged): the first PER_GROUP of each among screened-in, new genomes, in draw order."""
    from bnn.search.fitness import analyse
    from refimpl import PAPER_MEASURES, Genome
    from refimpl.operators import BINARY, UNARY

    earlier = {str(Genome.parse(g)) for g in (*PAPER_MEASURES, "baseline", *EARLIER)}
    rng = np.random.Generator(np.random.PCG64(SEED))
    groups: dict[bool, list[str]] = {True: [], False: []}
    while min(len(v) for v in groups.values()) < PER_GROUP:
        codes = [int(x) for x in rng.integers(0, len(UNARY), 4)] + [int(x) for x in rng.integers(0, len(BINARY), 3)]
        genome = str(Genome.parse("-".join(map(str, codes))))
        if genome in earlier or genome in groups[True] + groups[False]:
            continue
        if analyse(genome, COUNTS).screen_reason is not None:  # the search never trains it
            continue
        group = groups[flagged(genome)]
        if len(group) < PER_GROUP:
            group.append(genome)
    return groups[True], groups[False]


# The plan's recipe, as the journal's protocol line records it (--train-size 0 is null: every image).
RECIPE = {"dataset": "fashion-mnist", "model": "mnist_net", "epochs": 6, "train_size": None, "milestones": [4, 5],
          "measure_impl": "eager"}


def read(root: str) -> dict:
    """The cells of the plan's measures in ``root`` (binary downsampling, raw counts, seed 0): each one's
    outcome, the 2x2 and Fisher's test. The journal is read as ``bnn.evidence`` reads it (under the root's
    lock, every line checked); one trained with another recipe, or on two CPU kinds, is a ``GridError``."""
    from scipy.stats import fisher_exact

    from bnn.evidence.grid import lock_root
    from bnn.evidence.journal import GridError, read_journal

    with lock_root(root):
        protocol, done = read_journal(os.path.join(root, "journal.jsonl"), lambda m: print(m, file=sys.stderr))
    if protocol is None:
        raise GridError(f"{root} has an empty journal; give the root the plan's cells were trained in")
    wrong = {k: protocol.get(k) for k, v in RECIPE.items() if protocol.get(k) != v}
    if wrong:
        raise GridError(f"{root} was trained with {wrong}, not the plan's recipe {RECIPE}")
    cells = {r["measure"]: r for r in done.values()
             if (r["downsample"], r.get("counts", COUNTS), r["seed"]) == ("binary", COUNTS, 0)}
    flag, clean = plan()
    out = {"cells": [], "missing": []}
    table = {True: [0, 0], False: [0, 0]}  # flagged -> [failed, trained]
    for genome in flag + clean:
        row = cells.get(genome)
        if row is None or row["status"] not in ("ok", "diverged"):
            out["missing"].append(genome)
            continue
        failed = row["status"] == "diverged" or row["test_acc"] < FAILED_BELOW
        table[genome in flag][0 if failed else 1] += 1
        out["cells"].append({"genome": genome, "flagged": genome in flag, "status": row["status"],
                             "test_acc": row.get("test_acc"), "failed": failed, "cpu_kind": row.get("cpu_kind")})
    kinds = out["cpu_kinds"] = sorted({str(c["cpu_kind"]) for c in out["cells"]})
    if len(kinds) > 1:  # a cell on another CPU kind is another experiment (docs/evidence.md)
        raise GridError(f"{root} holds the plan's cells from {len(kinds)} CPU kinds ({', '.join(kinds)}); "
                        "the plan runs on one")
    out["table"] = {"flagged": table[True], "not_flagged": table[False]}
    out["fisher_one_sided_p"] = float(fisher_exact([table[True], table[False]], alternative="greater")[1])
    return out


def main(argv=None) -> int:
    """The command line: --plan or --read ROOT (the module's docstring)."""
    p = OneLineParser(prog="bench/probe_flag_check.py", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", action="store_true", help="print the drawn measures, flagged first, comma-separated")
    g.add_argument("--read", metavar="ROOT", help="an evidence root with their cells: print the 2x2 and the test")
    args = p.parse_args(argv)
    if args.plan:
        flag, clean = plan()
        print(",".join(flag + clean))
        print(f"flagged: {', '.join(flag)}\nnot flagged: {', '.join(clean)}", file=sys.stderr)
        return 0
    if not os.path.isfile(os.path.join(args.read, "journal.jsonl")):
        p.error(f"no journal.jsonl in {args.read}; give the root the plan's cells were trained in")
    from bnn.evidence.journal import GridError

    try:
        out = read(args.read)
    except GridError as exc:
        p.error(str(exc))
    for c in out["cells"]:
        acc = "-" if c["test_acc"] is None else f"{100 * c['test_acc']:.2f}%"
        print(f"{c['genome']:<22} {'flagged' if c['flagged'] else 'not flagged':<12} {c['status']:<9} {acc:>7}  "
              f"{'failed' if c['failed'] else 'trained'}")
    t = out["table"]
    print(f"flagged: {t['flagged'][0]} failed, {t['flagged'][1]} trained; not flagged: {t['not_flagged'][0]} failed, "
          f"{t['not_flagged'][1]} trained; Fisher's exact test, one-sided: p = {out['fisher_one_sided_p']:.4f}")
    if out["missing"]:
        print(f"not yet trained: {len(out['missing'])} of {2 * PER_GROUP}: {', '.join(out['missing'])}")
    print(f"cells: binary downsampling, {COUNTS} counts, seed 0, the plan's recipe; CPU: {', '.join(out['cpu_kinds']) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
