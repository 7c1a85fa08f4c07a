"""The search engine's side of a ladder (``bnn.search.ladder``): jobs, journal lines, caches, replay.

Journal lines of a ladder search, besides ``proposal`` and ``result``: ``reference`` (XNOR's
training at one rung and seed, paired searches only) and ``rung`` (one training of a candidate at
one rung and seed, or its answer from the cache). A ``result`` line is the candidate's end: the
rung it reached, its score there, its GA fitness. Every line is written after the state change it
records, so replaying the lines through a fresh ``Ladder`` rebuilds the state exactly; a decision
whose ``result`` line a kill cut off is taken again, identically, before anything new starts.
"""
from __future__ import annotations

import time

from .ga import BASELINE
from .journal import JournalError
from .ladder import Ladder

_RESULT_KEYS = ("status", "val_acc", "val_acc_per_epoch", "epochs", "wall_s", "reason", "error")


class LadderRun:
    """Drives one ``Ladder`` for a ``Search``: submits its trainings, journals their results, replays them."""

    def __init__(self, search):
        cfg = search.cfg
        self.search = search
        rungs = cfg.rungs or [{"epochs": cfg.epochs, "train_size": cfg.train_size, "seeds": 1}]
        self.ladder = Ladder(rungs, cfg.paired, cfg.promote, cfg.train_seed)
        self.known: dict[tuple, dict] = {}  # (genome or hash, rung, seed, T) -> a training's result
        self.pending: dict[int, tuple] = {}  # replay: final decisions whose result line is not read yet
        self.tally = {"trained": [0] * len(rungs), "cached": [0] * len(rungs), "references": 0, "status": {}}

    # -- keys and jobs --------------------------------------------------------------------------------
    def _threshold(self, seq: int, rung: int):
        return self.search.ga.in_flight[seq].threshold if rung == 0 else None  # T judges the first rung only

    def _keys(self, genome: str, rung: int, seed: int, T) -> list[tuple]:
        cache = self.search.cache
        keys = [("genome", genome, rung, seed, T)] if cache.use_cache else []
        if cache.use_equivalence:
            keys.append(("hash", cache.fhash(genome), rung, seed, T))
        return keys

    def _submit(self, seq: int, rung: int, seed: int) -> None:
        s = self.search
        genome, T = s.ga.in_flight[seq].genome, self._threshold(seq, rung)
        for kind, key in ((k[0], k) for k in self._keys(genome, rung, seed, T)):
            hit = self.known.get(key)
            if hit is not None:
                self._result(seq, rung, seed, {**hit, "wall_s": 0.0}, "cache" if kind == "genome" else "equivalent")
                return
        s.trainings_started += 1
        s.evaluator.submit({"seq": f"{seq}/{rung}/{seed}", "genome": genome, "reject_below": T,
                            "train": self.ladder.train_of(rung, seed)})

    def _submit_needed(self, seq: int) -> None:
        for rung, seed in self.ladder.needed(seq):
            if seq in self.ladder.runs and (rung, seed) in self.ladder.needed(seq):  # a cache hit may have moved it on
                self._submit(seq, rung, seed)

    # -- the engine's hooks ---------------------------------------------------------------------------
    def restart(self) -> None:
        """Start of a run (new or resumed): the references, the decisions a kill left unwritten, then
        the trainings every candidate in flight still needs, in seq order."""
        s = self.search
        for rung, seed in self.ladder.references_needed():
            s.trainings_started += 1
            # XNOR as BNNs use it, on raw counts, whatever the search's convention: the evidence's reference
            s.evaluator.submit({"seq": f"ref/{rung}/{seed}", "genome": BASELINE, "reject_below": None,
                                "train": {**self.ladder.train_of(rung, seed), "counts": "raw"}})
        for seq in sorted(self.pending):
            self._final(self.pending.pop(seq))
        for seq in sorted(s.ga.in_flight):
            if seq in self.ladder.runs:
                self._submit_needed(seq)
            else:
                self.dispatch_new(s.ga.in_flight[seq])

    def dispatch_new(self, p) -> None:
        """A new proposal: screened at once, or its first rung's trainings submitted."""
        s = self.search
        self.ladder.start(p.seq, p.genome)
        if s.cache.use_screening:
            reason = s.cache.analysis(p.genome).screen_reason
            if reason:
                self._final(self.ladder.screened(p.seq), source="screened", reason=reason)
                return
        self._submit_needed(p.seq)

    def on_done(self, key: str, res: dict) -> None:
        """A training came back from the evaluator."""
        parts = key.split("/")
        if parts[0] == "ref":
            rung, seed = int(parts[1]), int(parts[2])
            event = {"type": "reference", "rung": rung, "seed": seed, "genome": BASELINE, "counts": "raw",
                     **{k: res[k] for k in _RESULT_KEYS if res.get(k) is not None}, "time": time.time()}
            self.search.journal.append(event)
            self.tally["references"] += 1
            self._handle(self.ladder.on_reference(rung, seed, event))
            return
        self._result(int(parts[0]), int(parts[1]), int(parts[2]), res, "train")

    def _result(self, seq: int, rung: int, seed: int, res: dict, source: str) -> None:
        s = self.search
        genome = s.ga.in_flight[seq].genome
        event = {"type": "rung", "seq": seq, "genome": genome, "rung": rung, "seed": seed, "T": self._threshold(seq, rung),
                 "source": source, **{k: res[k] for k in _RESULT_KEYS if res.get(k) is not None}, "time": time.time()}
        s.journal.append(event)
        self._handle(self._apply_rung(event))

    def _apply_rung(self, e: dict) -> list[tuple]:
        r = e["rung"]
        if e["source"] == "train":
            self.tally["trained"][r] += 1
            self.tally["status"][e.get("status")] = self.tally["status"].get(e.get("status"), 0) + 1
            if e.get("status") in ("ok", "rejected", "diverged"):  # errors are not facts about the measure
                for key in self._keys(e["genome"], r, e["seed"], e.get("T")):
                    self.known.setdefault(key, {k: e[k] for k in _RESULT_KEYS if k in e})
        else:
            self.tally["cached"][r] += 1
        return self.ladder.on_result(e["seq"], r, e["seed"], e)

    def _handle(self, decisions: list[tuple]) -> None:
        for d in decisions:
            if d[0] == "promote":
                self._submit_needed(d[1])
            else:
                self._final(d)

    def _final(self, d: tuple, source: str = "ladder", reason: str | None = None) -> None:
        _, seq, rung, score, value, acc0 = d
        s = self.search
        p = s.ga.in_flight[seq]
        event = {"type": "result", "seq": seq, "genome": p.genome, "kind": p.kind, "T": p.threshold, "source": source,
                 "fitness": value, "rung": rung, "score": score, "accuracy": acc0,
                 "status": "screened" if source == "screened" else "ok",
                 "epochs": 0 if source == "screened" else self.ladder.rungs[rung]["epochs"], "time": time.time()}
        if reason:
            event["reason"] = reason
        s._apply_result(event, replay=False)

    # -- replay ----------------------------------------------------------------------------------------
    def replay(self, e: dict) -> None:
        """One journal line of a ladder search, in the order it was written."""
        t = e.get("type")
        if t == "proposal":
            self.ladder.start(e["seq"], e["genome"])
        elif t == "reference":
            self.tally["references"] += 1
            self.search.trainings_started += 1  # as a live run counted it when it submitted it
            self._pend(self.ladder.on_reference(e["rung"], e["seed"], e))
        elif t == "rung":
            self.search.trainings_started += e.get("source") == "train"
            self._pend(self._apply_rung(e))
        elif t == "result":
            d = self.pending.pop(e["seq"], None)
            if d is None:  # a screened candidate: final at once, no training
                d = self.ladder.screened(e["seq"])
            if (d[1], d[2], d[4]) != (e["seq"], e.get("rung"), e.get("fitness")):
                raise JournalError(f"replay diverged at the result of evaluation {e['seq']} (journal: rung {e.get('rung')}, "
                                   f"fitness {e.get('fitness')}; replay: rung {d[2]}, fitness {d[4]}); the journal was "
                                   "written by different code or settings")

    def _pend(self, decisions: list[tuple]) -> None:
        for d in decisions:
            if d[0] == "final":
                self.pending[d[1]] = d

    def progress(self) -> str:
        """The progress line's view: candidates scored on each rung so far, e.g. ``14/5/2``."""
        return "/".join(str(len(x)) for x in self.ladder.scores)

    def counts(self) -> dict:
        """The search's tallies as trainings count them (the engine's counts are of evaluations)."""
        st, cached = self.tally["status"], sum(self.tally["cached"])
        return {"trainings": sum(self.tally["trained"]) + self.tally["references"], "saved_by_cache": cached,
                "rejected": st.get("rejected", 0), "diverged": st.get("diverged", 0), "errors": st.get("error", 0)}

    def summary(self) -> dict:
        """What results.json and the progress line show of the ladder."""
        lad = self.ladder
        return {"rungs": lad.rungs, "paired": lad.paired, "promote": lad.fraction, "trained": self.tally["trained"],
                "cached": self.tally["cached"], "promoted": lad.promoted, "references": dict(
                    (f"{r}/{s}", v) for (r, s), v in sorted(lad.ref.items()))}
