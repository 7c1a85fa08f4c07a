"""Small statistics for the evidence grid, in pure Python (scipy is only a dev dependency).

Student's t quantile: the t CDF through the regularized incomplete beta function,
    F(t) = 1 - I_x(df/2, 1/2) / 2   for t >= 0, with x = df / (df + t^2),
evaluated with the continued fraction of Numerical Recipes (betacf, modified Lentz), then
inverted by bisection. Exact to ~1e-12, which the tests check against scipy.stats.t.ppf.
"""
from __future__ import annotations

import itertools
import math
import random

from .jsonl import is_accuracy

MAX_SPLITS = 500  # split_half: 12 seeds have 462 splits; more seeds, a sample of this many
MAX_SEEDS = 64  # split_half: no grid trains more; a file that claims more is read without the ceiling
VERDICTS = ("beats baseline", "worse", "within noise", "one pair: no interval")


def mean(xs) -> float | None:
    """The arithmetic mean; None for no values."""
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def sample_std(xs) -> float | None:
    """Standard deviation with n - 1 in the denominator; None below two values."""
    xs = list(xs)
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    # The continued fraction converges fast only below (a + 1) / (a + b + 2); use symmetry above.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The p quantile of Student's t with df degrees of freedom (0 < p < 1, df > 0)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_ppf needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def paired_interval(xs, ys, level: float = 0.95) -> dict:
    """Mean of the differences x - y and its two-sided t-interval; lo/hi None below two pairs."""
    diffs = [x - y for x, y in zip(xs, ys, strict=True)]
    n, m, s = len(diffs), mean(diffs), sample_std(diffs)
    if s is None:
        return {"n": n, "mean": m, "lo": None, "hi": None}
    half = t_ppf(0.5 + level / 2.0, n - 1) * s / math.sqrt(n)
    return {"n": n, "mean": m, "lo": m - half, "hi": m + half}


def verdict(lo: float | None, hi: float | None) -> str:
    """"beats baseline" only when the whole interval is above zero, "worse" when below; a single
    pair has no interval, and says so rather than "within noise"."""
    if lo is None and hi is None:
        return "one pair: no interval"
    if lo is not None and lo > 0:
        return "beats baseline"
    if hi is not None and hi < 0:
        return "worse"
    return "within noise"


def _average_ranks(xs) -> list[float]:
    """Ranks 1..n, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(xs, ys) -> float | None:
    """Spearman's rank correlation (Pearson's r of the average ranks); None below two pairs or for
    a constant side, where it is undefined."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs pairs: {len(xs)} x values, {len(ys)} y values")
    if len(xs) < 2:
        return None
    rx, ry = _average_ranks(list(xs)), _average_ranks(list(ys))
    mx, my = mean(rx), mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def bootstrap_spearman(xs, ys, resamples: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap interval (lo, hi) of Spearman's rho: the pairs resampled with replacement
    ``resamples`` times from a seeded generator (the same pairs give the same interval), resamples
    where rho is undefined (a constant side) left out; (None, None) below 3 pairs."""
    n = len(xs)
    if n < 3:
        return None, None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        r = spearman([xs[i] for i in idx], [ys[i] for i in idx])
        if r is not None:
            values.append(r)
    if not values:
        return None, None
    values.sort()
    # The empirical quantile: the smallest resampled rho whose share at or below it reaches q.
    # q * n is rounded first: (1 - 0.95) / 2 * 2000 is 50.00000000000004 in binary, whose ceiling is 51, not 50.
    quantile = lambda q: values[min(len(values) - 1, max(0, math.ceil(round(q * len(values), 9)) - 1))]  # noqa: E731
    return quantile((1.0 - level) / 2.0), quantile((1.0 + level) / 2.0)


def top_agreement(xs, ys, k: int = 3) -> int:
    """How many of the k pairs ranked best by ``xs`` are also among the k best by ``ys`` (ties: the earlier pair first)."""
    top = lambda v: set(sorted(range(len(v)), key=lambda i: -v[i])[:k])  # noqa: E731
    return len(top(list(xs)) & top(list(ys)))


def split_half(per_seed: list[dict]) -> dict | None:
    """The full recipe against itself: its seeds split into two halves every way, each cell's mean test
    accuracy over one half ranked against its mean over the other (Spearman). ``per_seed``: each cell's
    {seed: test accuracy, or a status for a run that did not finish ok}; a cell with no accuracy in a half
    sits out that split, as test_mean leaves such runs out. How well the target ranks itself, on half its
    seeds: a ceiling a cheap design's rho is read against (the six-seed means rank themselves better still).
    None below two seeds common to every cell or above MAX_SEEDS; above 12 seeds, a seeded sample of MAX_SPLITS splits."""
    seeds = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    if not 2 <= len(seeds) <= MAX_SEEDS:
        return None
    half = len(seeds) // 2
    acc = lambda c, part: [v for s in part if is_accuracy(v := c[s])]  # noqa: E731
    # An even count's split once: named by its half that holds the first seed.
    names_split = lambda a: len(seeds) > 2 * half or seeds[0] in a  # noqa: E731
    if len(seeds) <= 12:  # every split: 462 at most
        halves = [a for a in itertools.combinations(seeds, half) if names_split(a)]
    else:  # many seeds: a seeded sample of the splits, not every one of them
        rng, drawn = random.Random(0), set()
        while len(drawn) < MAX_SPLITS:
            a = frozenset(rng.sample(seeds, half))
            drawn.add(a if names_split(a) else frozenset(seeds) - a)
        halves = sorted(tuple(sorted(a)) for a in drawn)
    rhos = []
    for a in halves:
        b = [s for s in seeds if s not in a]
        pairs = [(mean(x), mean(y)) for c in per_seed if (x := acc(c, a)) and (y := acc(c, b))]
        rho = spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) >= 3 else None
        if rho is not None:
            rhos.append(rho)
    if not rhos:
        return None
    return {"seeds": len(seeds), "half": half, "splits": len(rhos), "rho_mean": mean(rhos),
            "rho_min": min(rhos), "rho_max": max(rhos)}


def split_half_text(r: dict) -> str:
    """split_half's result as the line printed under the table."""
    return (f"The full recipe against itself (a ceiling for any cheaper fitness): its {r['seeds']} seeds split into halves of "
            f"{r['half']}, each half's means ranked against the other's: rho {r['rho_mean']:.2f} on average over "
            f"{r['splits']} splits ({r['rho_min']:.2f} to {r['rho_max']:.2f}).")
