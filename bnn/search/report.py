"""What a user sees at the end (and on Ctrl-C): leaderboard, results.json, search.png."""
from __future__ import annotations

import io
import shlex
from pathlib import Path

from refimpl.fileio import atomic_write_bytes, check_output, remove_stale_temps

from .loop import Search, write_json_atomic

OUTPUTS = ("results.json", "search.png")


def prepare_outputs(run_dir: Path) -> None:
    """At start: refuse outputs that are not regular files (before hours of search, not after),
    and remove the temp files of writers killed in an earlier run."""
    for name in OUTPUTS:
        check_output(Path(run_dir) / name)
    remove_stale_temps(run_dir)  # only names fileio made: a user's "results.json.tmp" stays


def next_steps(search: Search, top: int = 3) -> list[str]:
    """What to run after a search, with its own settings: a search's fitness is a short, noisy proxy
    (docs/evidence.md), so its best few are retrained with the full recipe over seeds, paired with XNOR."""
    cfg = search.cfg
    best = [r["genome"] for r in search.leaderboard() if r["name"] != "baseline"][:top]
    if cfg.fitness != "train" or not best:
        return []
    data = f"--dataset {cfg.dataset} --model {cfg.model}" + (f" --data-dir {shlex.quote(cfg.data_dir)}" if cfg.data_dir else "")
    if cfg.downsample != "binary":  # the grid's --measures train binary shortcuts
        return ["next: retrain the best with your full recipe on several seeds, XNOR beside them on the same seeds:",
                *[f"  python -m bnn.train {data} --downsample {cfg.downsample} --counts {c} --measure {g} --seed 0"
                  for g, c in [(best[0], cfg.counts), ("baseline", "raw")]]]
    grid = f"python -m bnn.evidence {data} --root {shlex.quote(str(search.run_dir / 'evidence'))} --seeds 0,1,2,3,4,5 " \
           "--real-measures none"
    recipe = "the full recipe" if not cfg.dataset.startswith("cifar") else "the paper's 15-epoch recipe (a GPU's work)"
    lines = [f"next: retrain the best with {recipe} on six seeds, paired with XNOR by seed (a search's fitness is "
             "a short, noisy proxy; believe a gain whose whole interval is above zero):"]
    if cfg.counts == "raw":
        return [*lines, f"  {grid} --counts raw --measures baseline,{','.join(best)}"]
    return [*lines, f"  {grid} --counts raw --measures baseline", f"  {grid} --counts {cfg.counts} --measures {','.join(best)}"]


def leaderboard_text(search: Search, top: int | None = None) -> str:
    """The leaderboard as printed at the end of a search (the ``top`` best rows, or all)."""
    rows = search.leaderboard()[:top] if top else search.leaderboard()
    if not rows:
        return "leaderboard: no member yet (initialization has kept nobody)"
    title = "population" if search.ga.formed else "initialization so far (population not formed yet)"
    ladder = "rung" in rows[0]  # ranked by the rung reached, then the score there (bnn/search/ladder.py)
    paired = ladder and search.cfg.paired
    head = (f"{'rung':>4}  {'vs XNOR' if paired else 'score':>8}" if ladder else f"{'fitness':>7}")
    lines = [f"{title}, best first:", f"{'rank':>4}  {'genome':<28} {head}  {'epochs':>6}  formula"]
    for r in rows:
        name = f" ({r['name']})" if r["name"] else ""
        epochs = "" if r["epochs"] is None else str(r["epochs"])
        value = (f"{r['rung']:>4}  {r['score']:>+8.4f}" if paired else f"{r['rung']:>4}  {r['score']:>8.4f}") \
            if ladder else f"{r['fitness']:>7.4f}"
        lines.append(f"{r['rank']:>4}  {r['genome'] + name:<28} {value}  {epochs:>6}  {r['formula']}")
    s = search.summary_counts()
    lines.append(
        f"{s['evaluations']} evaluations, {s['trainings']} trainings; saved by cache {s['saved_by_cache']}, "
        f"by equivalence {s['saved_by_equivalence']}, by screening {s['saved_by_screening']}; "
        f"{s['rejected']} rejected early, {s['diverged']} diverged, {s['errors']} errors"
    )
    return "\n".join(lines)


def write_results(search: Search) -> Path:
    """Write RUN_DIR/results.json (config, summary, population, evaluations, history) atomically; returns its path."""
    path = search.run_dir / "results.json"
    write_json_atomic(path, {
        "config": _config(search),
        "summary": search.summary(),
        "population": search.leaderboard(),
        "evaluations": [search.results[k] for k in sorted(search.results)],
        "history": [{"evaluations": n, "best": b, "median": m} for n, b, m in search.history],
    })
    return path


def _config(search: Search) -> dict:
    from dataclasses import asdict

    return asdict(search.cfg)


# Each evaluation's source (the journal's "source") as the plot draws it; one without a style would go unplotted.
SOURCE_STYLES = {"train": ("tab:blue", "o", "trained"), "cache": ("tab:gray", "x", "cache"),
                 "reuse": ("tab:gray", "+", "reuse"), "equivalent": ("tab:green", "x", "equivalent"),
                 "screened": ("tab:red", "v", "screened"), "ladder": ("tab:blue", "o", "ladder")}


def fitness_label(search: Search) -> str:
    """What the plot's fitness is: on a ladder the GA's sort key, the rung reached and then its score."""
    if search.ladder is None:
        return "fitness (validation accuracy)"
    if search.cfg.paired:
        return "fitness: rung reached + (1 + validation accuracy vs XNOR) / 2"
    return "fitness: rung reached + validation accuracy"


def write_plot(search: Search) -> str:
    """RUN_DIR/search.png, or a note saying why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no search.png: matplotlib is not installed (pip install 'bnn-measure-search[plot]')"
    evs = [search.results[k] for k in sorted(search.results, key=lambda k: search.results[k].get("time", 0))]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for source, (color, marker, label) in SOURCE_STYLES.items():
        pts = [(i + 1, e["fitness"]) for i, e in enumerate(evs) if e.get("source") == source]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=10, c=color, marker=marker, label=f"{label} ({len(pts)})", alpha=0.6)
    if search.history:
        n, best, med = zip(*search.history)
        ax.plot(n, best, color="black", lw=1.5, label="population best")
        ax.plot(n, med, color="tab:orange", lw=1.5, label="population median")
    ax.set_xlabel("evaluation (completion order)")
    ax.set_ylabel(fitness_label(search))
    for r in range(1, len(search.cfg.rungs or [])):  # a ladder's fitness is the rung reached first
        ax.axhline(r, color="gray", lw=0.8, ls=":")
    what = (f"{search.cfg.model} ({search.cfg.downsample} downsampling, {search.cfg.counts} counts) on {search.cfg.dataset}"
            if search.cfg.fitness == "train"
            else f"synthetic fitness ({search.cfg.fitness})")
    ax.set_title(f"GA search: {what}, S={search.cfg.population}")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    path = search.run_dir / "search.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return f"wrote {path}"
