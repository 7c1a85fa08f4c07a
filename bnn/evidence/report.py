"""The evidence grid's report: statistics per measure, results.json, results.md, accuracy.png.

Everything here is computed from the journal's cell entries alone, so a rerun (or
``--table-only``) rebuilds the same report from the same journal. Accuracies are fractions in
the JSON (as everywhere in the project) and percent / percentage points in the table.
"""
from __future__ import annotations

import io
import json
import os

from refimpl.conventions import DEFAULT as RAW
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.fileio import atomic_write_bytes as atomic_write  # temp file, fsync, rename, fsync the folder
from refimpl.fileio import check_output

from ..common import stats as _stats
from ..paper_results import MEASURES


def counts_of(entry: dict) -> str:
    """A cell's count convention; journals written before conventions existed hold raw cells."""
    return entry.get("counts", RAW)


def _order(entries) -> list[tuple[str, str, str]]:
    """(measure, downsample, counts) groups: binary first, conventions in the table's order, the
    paper's measures in its order, then others as met."""
    groups = {(e["measure"], e["downsample"], counts_of(e)) for e in entries}
    rank = {m: i for i, m in enumerate(MEASURES)}
    first_seen = {}
    for i, e in enumerate(entries):
        first_seen.setdefault(e["measure"], i)
    return sorted(groups, key=lambda g: (g[1] != "binary", g[1], CONVENTIONS.index(g[2]), rank.get(g[0], len(rank)),
                                         first_seen[g[0]]))


def kind_of(entry: dict) -> str | None:
    """The CPU kind a cell trained on: its ``cpu_kind``; for a cell journaled before kinds were
    recorded, the CPU model its host label names; None where neither was recorded."""
    if entry.get("cpu_kind"):
        return entry["cpu_kind"]
    host = entry.get("host")
    return host.split(", ")[0] if host else None


def same_kind(x: dict, y: dict) -> bool:
    """Whether two cells may be paired: trained on one kind of CPU (torch's CPU kernels round
    differently per instruction set, so a cell on another kind is like a fresh seed). A cell
    without a full kind is compared by CPU model; one with no host recorded pairs with any."""
    kx, ky = kind_of(x), kind_of(y)
    if kx is None or ky is None:
        return True
    if x.get("cpu_kind") and y.get("cpu_kind"):
        return kx == ky
    return kx.split("; ")[0] == ky.split("; ")[0]


def summarize(entries: list[dict], baseline: str = "baseline", family: int = 1) -> list[dict]:
    """One row per (measure, downsample, counts): mean and sample std of the test accuracy over "ok"
    runs, the other statuses counted, and the paired difference to the reference: XNOR as BNNs use
    it, the baseline of the same downsampling on raw counts, paired by seed where both arms trained
    on one kind of CPU. ``family`` > 1 adds each row's interval at the family-wise 95% level for
    that many comparisons (Bonferroni: 1 - 0.05 / family each), and the verdict is read from it."""
    by_group: dict[tuple[str, str, str], dict[int, dict]] = {}
    for e in entries:
        by_group.setdefault((e["measure"], e["downsample"], counts_of(e)), {})[e["seed"]] = e
    rows = []
    for measure, kind, counts in _order(entries):
        cells = by_group[(measure, kind, counts)]
        is_reference = measure == baseline and counts == RAW
        ok = {s: e for s, e in sorted(cells.items()) if e["status"] == "ok"}
        tests = [e["test_acc"] for e in ok.values()]
        statuses = {st: sum(e["status"] == st for e in cells.values()) for st in ("diverged", "rejected", "error")}
        row = {
            "measure": measure, "genome": next(iter(cells.values()))["genome"], "downsample": kind,
            "counts": counts, "n": len(cells), "n_ok": len(ok), **statuses,
            "test_mean": _stats.mean(tests), "test_std": _stats.sample_std(tests),
            "val_mean": _stats.mean(e["val_acc"] for e in ok.values()),
            "per_seed": {str(s): (e["test_acc"] if e["status"] == "ok" else e["status"]) for s, e in sorted(cells.items())},
            "cpu_kinds": sorted({k for e in cells.values() if (k := kind_of(e))}),
            "vs_baseline": None,
            "verdict": _no_pairs_verdict(is_reference, ok, statuses, (baseline, kind, RAW) in by_group),
        }
        base = by_group.get((baseline, kind, RAW), {})
        both = [s for s in ok if base.get(s, {}).get("status") == "ok"] if not is_reference else []
        seeds = [s for s in both if same_kind(ok[s], base[s])]
        if both and not seeds:
            row["verdict"] = "no pairs on one CPU kind"
        if seeds:
            xs, ys = [ok[s]["test_acc"] for s in seeds], [base[s]["test_acc"] for s in seeds]
            diff = _stats.paired_interval(xs, ys)
            row["vs_baseline"] = {**diff, "seeds": seeds, "level": 0.95,
                                  "other_kind_seeds": [s for s in both if s not in seeds]}
            row["verdict"] = _stats.verdict(diff["lo"], diff["hi"])
            if family > 1:
                level = 1.0 - 0.05 / family
                fw = _stats.paired_interval(xs, ys, level)
                row["vs_baseline_family"] = {**fw, "seeds": seeds, "level": level, "family": family}
                row["verdict"] = _stats.verdict(fw["lo"], fw["hi"])
        rows.append(row)
    return rows


def _no_pairs_verdict(is_baseline: bool, ok: dict, counts: dict, has_baseline: bool) -> str:
    """The verdict column where no paired difference can be computed."""
    if is_baseline:
        return "reference"
    if not ok:
        return "all diverged" if counts["diverged"] and not (counts["rejected"] or counts["error"]) else "no ok runs"
    return "no ok pairs" if has_baseline else "no baseline"


def _pct(v, digits=2) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}"


def _pp(v) -> str:
    return "-" if v is None else f"{100 * v:+.2f}"


def duration(seconds: float) -> str:
    """'2 h 05 min', or '3.5 min' under an hour."""
    m = round(seconds / 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{seconds / 60:.1f} min"


def protocol_sentence(p: dict) -> str:
    """The protocol ``p`` as the report's sentence."""
    train = "all training images" if p.get("train_size") is None else f"{p['train_size']:,} training images"
    milestones = p.get("milestones") or []
    ms = ", ".join(str(m) for m in milestones) or "none"
    if milestones and all(m >= p["epochs"] for m in milestones):  # after the last epoch: never applied
        ms += f" (none within the {p['epochs']} epoch{'s' if p['epochs'] != 1 else ''})"
    val = "the data set's default" if p.get("val_size") is None else f"{p['val_size']:,} images"
    epochs = f"{p['epochs']} epoch{'s' if p['epochs'] != 1 else ''}"
    return (f"{p['dataset']}, {p['model']}: {epochs} on {train} (validation: {val} "
            f"held out, split seed {p.get('split_seed', 0)}), batch {p['batch_size']}, Adam lr {p['lr']:g} "
            f"x {p.get('gamma', 0.2):g} after epochs: {ms}. Each cell reports its final model; nothing is "
            f"selected on the test set.")


def markdown(results: dict) -> str:
    """results.md: the protocol, the table per measure and the paired differences."""
    from ..train.host import host_label  # lazily: bnn.train brings torch, which a report of a journal does not need

    p, wall = results["protocol"], results["wall_s"]
    family = results.get("family", 1)
    family_text = (f" With {family} comparisons the verdict is read from the family-wise 95% interval (Bonferroni: "
                   f"{100 * (1 - 0.05 / family):.2f}% each), in its own column." if family > 1 else "")
    hosts = "; ".join(results.get("cells_ran_on") or [host_label(results["host"])])
    lines = [
        f"# Evidence grid: does a searched measure beat XNOR on {p['dataset']}?",
        "",
        f"Protocol: {protocol_sentence(p)}",
        "",
        (f"Host: {hosts}. Wall time: {duration(wall['cells'])} of training over {results['cells_done']} cells "
         f"({duration(wall['this_run'])} in the last run)."),
        "",
        ("Test accuracy in percent: mean and sample std over the seeds that finished \"ok\"; diverged "
         "runs are counted, not averaged. Counts: the count convention (docs/design.md section 2). The "
         "difference to XNOR (the baseline of the same downsampling on raw counts) is paired by seed "
         "and CPU kind (percentage points, 95% t-interval); \"beats baseline\" only when the whole interval "
         "is above zero, \"worse\" when it is below." + family_text),
        "",
        f"| measure | downsample | counts | ok / runs | diverged | test % mean | std | val % mean | "
        f"vs baseline, pp [95% CI] | {'family-wise CI | ' if family > 1 else ''}pairs | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if family > 1 else ""),
    ]
    for r in results["rows"]:
        d = r["vs_baseline"] or {}
        ci = f"{_pp(d.get('mean'))} [{_pp(d.get('lo'))}, {_pp(d.get('hi'))}]" if d else "-"
        if family > 1:
            f = r.get("vs_baseline_family") or {}
            ci += f" | [{_pp(f.get('lo'))}, {_pp(f.get('hi'))}]" if f else " | -"
        lines.append(f"| {r['measure']} | {r['downsample']} | {r.get('counts', RAW)} | {r['n_ok']} / {r['n']} | {r['diverged']} | "
                     f"{_pct(r['test_mean'])} | {_pct(r['test_std'])} | {_pct(r['val_mean'])} | {ci} | "
                     f"{d.get('n', 0)} | {r['verdict']} |")
    unpaired = [f"{r['measure']}/{r['downsample']}/{r.get('counts', RAW)}: seeds "
                f"{', '.join(map(str, r['vs_baseline']['other_kind_seeds']))}"
                for r in results["rows"] if (r["vs_baseline"] or {}).get("other_kind_seeds")]
    if unpaired:
        lines += ["", "Not paired (the two arms trained on different kinds of CPU; rerun both on one kind): "
                  + "; ".join(unpaired) + "."]
    missing = sorted({r["downsample"] for r in results["rows"] if r["verdict"] == "no baseline"})
    if missing:
        lines += ["", f"No XNOR cells (baseline on raw counts) with {' or '.join(missing)} downsampling in this root, so "
                  "nothing is paired: add them with the same command and --root, with --counts raw --measures baseline."]
    other = [f"{r['measure']}/{r['downsample']}/{r.get('counts', RAW)}: {r['rejected']} rejected, {r['error']} errors"
             for r in results["rows"] if r["rejected"] or r["error"]]
    if other:
        lines += ["", "Not counted: " + "; ".join(other) + "."]
    return "\n".join(lines) + "\n"


def _series(row: dict) -> str:
    return f"downsample {row['downsample']}, {row.get('counts', RAW)} counts"


def difference_bars(row: dict) -> list[tuple[str, float, float, float]]:
    """The whiskers of a row's paired difference to XNOR, in points, as ``(kind, mean, lo, hi)``:
    the 95% interval, and where the verdict reads a family-wise one (``--family`` > 1) that one too,
    so that the plot shows the interval the verdict rests on."""
    bars = []
    for kind, key in (("95%", "vs_baseline"), ("family-wise", "vs_baseline_family")):
        d = row.get(key)
        if d and d.get("lo") is not None:
            bars.append((kind, 100 * d["mean"], 100 * d["lo"], 100 * d["hi"]))
    return bars


def plot_png(rows: list[dict], title: str) -> bytes:
    """Two panels, one series per downsampling kind and count convention: the mean test accuracy per
    measure with std error bars, and its paired difference to XNOR with the 95% interval (the
    verdict: an interval wholly above the zero line beats XNOR) and, for a family of comparisons,
    the wider family-wise interval the verdict is read from, in a lighter line with wide caps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = list(dict.fromkeys(r["measure"] for r in rows))
    kinds = list(dict.fromkeys(_series(r) for r in rows))
    wide = max(6.0, 0.6 * len(measures) + 2)
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(wide, 7.5), sharex=True)
    width = 0.7 / max(1, len(kinds))
    for k, kind in enumerate(kinds):
        for r in (r for r in rows if _series(r) == kind):
            x = measures.index(r["measure"]) + (k - (len(kinds) - 1) / 2) * width
            if r["test_mean"] is not None:
                ax.errorbar(x, 100 * r["test_mean"], yerr=100 * (r["test_std"] or 0.0), fmt="o", capsize=3,
                            color=f"C{k}", label=kind)
            if r["diverged"]:
                ax.annotate(f"{r['diverged']} div.", (x, 0.02), xycoords=("data", "axes fraction"),
                            ha="center", fontsize=7, color=f"C{k}")
            bars = difference_bars(r)
            for kind_of_bar, m, lo, hi in reversed(bars):  # the wider one first, behind
                family = kind_of_bar == "family-wise"
                dx.errorbar(x, m, yerr=[[m - lo], [hi - m]], fmt="o", capsize=7 if family else 3,
                            color=f"C{k}", alpha=0.4 if family else 1.0, lw=1.0 if family else 1.5)
            if bars:
                dx.annotate(f"n={r['vs_baseline']['n']}", (x, max(b[3] for b in bars)), textcoords="offset points",
                            xytext=(0, 3), ha="center", fontsize=6, color=f"C{k}")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), list(unique), loc="best", fontsize=8)
    ax.set_ylabel("test accuracy, % (mean ± std over seeds)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    dx.axhline(0.0, color="k", lw=0.8)
    family = max((r.get("vs_baseline_family") or {}).get("family", 1) for r in rows) if rows else 1
    dx.set_ylabel("vs XNOR, points (paired, 95% CI" + (f";\nwide caps: family-wise 95%, {family} comparisons)"
                                                        if family > 1 else ")"))
    dx.grid(axis="y", alpha=0.3)
    dx.set_xticks(range(len(measures)), measures, rotation=30 if max(map(len, measures)) > 8 else 0, ha="right"
                  if max(map(len, measures)) > 8 else "center", fontsize=8)
    dx.set_xlim(-0.6, len(measures) - 0.4)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


REPORT_FILES = ("results.json", "results.md", "accuracy.png")


def check_report_files(root: str) -> None:
    """Refuse a report file that is not a regular file (a folder in its place) before any cell trains."""
    for name in REPORT_FILES:
        check_output(os.path.join(root, name))


def write_report(root: str, results: dict, plot: bool, log) -> None:
    """results.json, results.md and (``plot``) accuracy.png in ``root``, each written atomically."""
    # allow_nan=False: results.json is strict JSON; the journal's reader let no NaN in.
    atomic_write(os.path.join(root, "results.json"), (json.dumps(results, indent=1, allow_nan=False) + "\n").encode())
    atomic_write(os.path.join(root, "results.md"), markdown(results).encode())
    if not plot:
        return
    try:
        png = plot_png(results["rows"], protocol_sentence(results["protocol"]).split(":")[0])
    except ImportError:
        log("note: matplotlib is not installed; skipped accuracy.png (pip install matplotlib)")
        return
    atomic_write(os.path.join(root, "accuracy.png"), png)
