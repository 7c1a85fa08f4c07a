"""Damaged and crafted journals (issue 30 section 9): the evidence grid's and the search's readers
answer every journal with its content or one line naming the bad line, never a traceback, and
results.json stays strict JSON. The fuzz tests draw whole journals from valid lines, JSON values of
any shape and raw bytes; BNN_FUZZ_EXAMPLES raises their example count (a campaign: 5000)."""
import json
import os
import string

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bnn import evidence
from bnn.search import cli as search_cli
from bnn.search import journal as jr
from bnn.search.loop import Search, SearchConfig
from refimpl.genome import Genome

FUZZ_EXAMPLES = int(os.environ.get("BNN_FUZZ_EXAMPLES", "60"))
SYN = ["--fitness", "synthetic:2", "--population", "4", "--epochs", "3", "--thresholds", "0.2",
       "--max-evaluations", "6", "--no-progress"]
PROTOCOL = {"dataset": "digits", "model": "digits_net", "epochs": 1, "batch_size": 128, "lr": 0.005,
            "train_size": None, "val_size": None, "gamma": 0.2, "split_seed": 0, "milestones": [2]}
CELL = {"key": "baseline/binary/s0", "measure": "baseline", "genome": "0-0-0-0-0-0-1", "downsample": "binary",
        "seed": 0, "status": "ok", "val_acc": 0.5, "test_acc": 0.5, "epochs": 1, "wall_s": 1.0, "host": "h"}


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _evidence_journal(root, *rows, raw: bytes = b"") -> None:
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": "protocol", "version": 1, "protocol": PROTOCOL}), *map(json.dumps, rows)]
    (root / "journal.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + raw)


@pytest.mark.parametrize("journal, message", [
    (b"7\n", "does not start with a protocol line"),
    (b'[{"kind": "protocol"}]\n', "does not start with a protocol line"),
    (b'{"kind": "protocol", "version": 1}\n', "line 1 has no protocol object"),
])
def test_a_crafted_first_line_is_one_error_line(tmp_path, journal, message, capsys):
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "journal.jsonl").write_bytes(journal)
    assert evidence.main(["--dataset", "digits", "--root", str(tmp_path / "ev"), "--table-only", "--no-plot"]) == 2
    assert message in _one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path / "ev")) == ["journal.jsonl", "lock"]


@pytest.mark.parametrize("change, message", [
    ({"milestones": [float("inf")]}, "milestones is [inf]"),  # found by the fuzz test below: results.json held Infinity
    ({"milestones": [0]}, "milestones are [0]"), ({"milestones": ["2"]}, "milestones are ['2']"),
    ({"measure_grad_clip": float("nan")}, "measure_grad_clip holds NaN or infinity"),
    ({"step": {"x": [float("-inf")]}}, "step holds NaN or infinity"), ({"lr": float("nan")}, "lr is nan"),
])
def test_a_protocol_with_a_non_finite_or_bad_value_is_one_error_line_and_no_report(tmp_path, change, message,
                                                                                   capsys):
    root = tmp_path / "ev"
    root.mkdir()
    line = {"kind": "protocol", "version": 1, "protocol": {**PROTOCOL, **change}}
    (root / "journal.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(CELL) + "\n")
    assert evidence.main(["--dataset", "digits", "--root", str(root), "--table-only", "--no-plot"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "line 1 has a protocol whose" in err and message in err, err
    assert not (root / "results.json").exists()


@pytest.mark.parametrize("change", [{"test_acc": "0.5"}, {"test_acc": None}, {"test_acc": float("nan")},
                                    {"val_acc": float("inf")}, {"seed": "0"}, {"measure": None}])
def test_a_cell_with_a_wrong_value_is_one_error_line_and_no_report(tmp_path, change, capsys):
    _evidence_journal(tmp_path / "ev", {**CELL, **change})
    assert evidence.main(["--dataset", "digits", "--root", str(tmp_path / "ev"), "--table-only", "--no-plot"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: ") and "line 2 has" in line, line
    assert not (tmp_path / "ev" / "results.json").exists()


def test_a_good_journal_is_tabulated_as_strict_json(tmp_path, capsys):
    _evidence_journal(tmp_path / "ev", CELL, {**CELL, "key": "M1/binary/s0", "measure": "M1", "genome": "3-0-3-0-0-1-6", "status": "diverged",
                                             "test_acc": None, "val_acc": None})
    assert evidence.main(["--dataset", "digits", "--root", str(tmp_path / "ev"), "--table-only", "--no-plot"]) == 0
    text = (tmp_path / "ev" / "results.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"results.json holds {c}"))


def test_results_json_that_is_a_folder_is_refused_before_any_cell_trains(tmp_path, monkeypatch, capsys):
    import bnn.train as bnn_train

    monkeypatch.setattr(bnn_train, "train_model", lambda *a, **k: pytest.fail("a cell trained"))
    (tmp_path / "ev" / "results.json").mkdir(parents=True)
    assert evidence.main(["--dataset", "digits", "--epochs", "1", "--root", str(tmp_path / "ev"), "--no-progress",
                          "--no-plot", "--measures", "baseline", "--seeds", "0", "--real-measures", "none"]) == 2
    assert "results.json: it is a folder" in _one_error_line(capsys.readouterr().err)


# -- the search journal -----------------------------------------------------------------------------

def _start(config) -> bytes:
    return (json.dumps({"type": "start", "version": 1, **({} if config is None else {"config": config})}) + "\n").encode()


@pytest.mark.parametrize("journal", [_start(None), _start([1, 2]), _start("x"), b"3\n", b'["start"]\n'])
def test_a_search_journal_without_a_config_object_is_one_error_line(tmp_path, journal, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / jr.JOURNAL).write_bytes(journal)
    assert search_cli.main(["--resume", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "not a search journal" in _one_error_line(capsys.readouterr().err)
    assert (tmp_path / "run" / jr.JOURNAL).read_bytes() == journal


def test_a_result_line_that_cannot_be_replayed_is_one_error_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert search_cli.main([*SYN, "--run-dir", str(run)]) == 0
    with open(run / jr.JOURNAL, "ab") as f:
        f.write(b'{"type": "result", "genome": "0-0-0-0-0-0-1"}\n')  # no seq
    capsys.readouterr()
    assert search_cli.main(["--resume", str(run), "--max-evaluations", "8", "--no-progress"]) == 2
    assert "cannot be replayed" in _one_error_line(capsys.readouterr().err)


def test_a_refused_reuse_leaves_no_new_run_folder(tmp_path, capsys):
    assert search_cli.main([*SYN, "--run-dir", str(tmp_path / "old")]) == 0
    capsys.readouterr()
    new = tmp_path / "new"
    assert search_cli.main([*SYN, "--epochs", "4", "--reuse", str(tmp_path / "old"), "--run-dir", str(new)]) == 2
    assert "--reuse" in _one_error_line(capsys.readouterr().err)
    assert not new.exists()


# -- fuzz ---------------------------------------------------------------------------------------------

_SCALARS = st.none() | st.booleans() | st.integers(-2, 2**70) | st.floats() | st.text(string.printable, max_size=8)
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(sorted({*CELL, *PROTOCOL, "kind", "protocol", "type", "config",
                                                               "seq", "genome", "fitness"})), inner, max_size=4),
                     max_leaves=8)


def _mutated(base: dict):
    return st.builds(lambda k, v, drop: {kk: vv for kk, vv in {**base, k: v}.items() if kk != drop},
                     st.sampled_from(sorted(base)), _JSON, st.sampled_from([None, *sorted(base)]))


# Cells a grid could have written, so that most journals get past the reader to the report.
_CELLS = st.builds(lambda m, s, status, t, v: {**CELL, "key": f"{m}/binary/s{s}", "measure": m, "seed": s,
                                               "genome": str(Genome.parse(m)), "status": status, "test_acc": t, "val_acc": v},
                   st.sampled_from(["baseline", "M1", "M6"]), st.integers(0, 2), st.sampled_from(["ok", "ok", "diverged"]),
                   st.floats(0, 1), st.floats(0, 1))


def _lines(first):
    good = _CELLS.map(lambda v: json.dumps(v).encode())
    bad = (st.one_of(_JSON, _mutated(CELL)).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=12)
           | st.just(b"[" * 100_000))
    line = st.integers(0, 9).flatmap(lambda k: good if k < 8 else bad)  # mostly lines a grid writes
    return st.builds(lambda head, rest, tail: b"\n".join([head, *rest]) + tail,
                     first, st.lists(line, max_size=4), st.sampled_from([b"\n", b"", b'\n{"to']))


_GOOD_FIRST = st.just(json.dumps({"kind": "protocol", "version": 1, "protocol": PROTOCOL}).encode())
_BAD_FIRST = (_mutated(PROTOCOL).map(lambda p: json.dumps({"kind": "protocol", "protocol": p}).encode())
              | _JSON.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=12))
_EVIDENCE_FIRST = st.integers(0, 9).flatmap(lambda k: _GOOD_FIRST if k < 6 else _BAD_FIRST)
_SEARCH_FIRST = (st.builds(lambda c: _start(c).rstrip(b"\n"), _JSON | _mutated({"population": 4, "seed": 0}))
                 | _JSON.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=12))
_FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@_FUZZ
@given(raw=_lines(_EVIDENCE_FIRST))
def test_fuzzed_evidence_journal_is_read_and_reported_or_one_grid_error(raw, tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(raw)
    try:
        protocol, done = evidence.read_journal(str(path), lambda line: None)
    except evidence.GridError as exc:
        assert "\n" not in str(exc)
        event("refused")
        return
    if protocol is None:
        event("no protocol yet")
        return
    results = evidence.build_results(protocol, done, "cpu", 0.0)
    json.dumps(results, allow_nan=False)  # strict JSON, or this raises
    assert evidence.report.markdown(results)
    event(f"reported, {'no' if not done else 'some'} cells")


@_FUZZ
@given(raw=_lines(_SEARCH_FIRST))
def test_fuzzed_search_journal_is_read_or_one_journal_error(raw, tmp_path):
    path = tmp_path / jr.JOURNAL
    path.write_bytes(raw)
    try:
        events, good = jr.read(path)
        SearchConfig.from_mapping(Search.config_from_journal(tmp_path))
    except ValueError as exc:  # JournalError, or a setting from_mapping refuses: the CLI's one line
        assert str(exc).strip()
        event(type(exc).__name__)
        return
    assert all(isinstance(e, dict) for e in events) and 0 < good <= len(raw)
    event("read")


@pytest.fixture(scope="module")
def search_journal(tmp_path_factory) -> list[bytes]:
    """The lines of a real (synthetic-fitness) search's journal."""
    run = tmp_path_factory.mktemp("search") / "run"
    assert search_cli.main([*SYN, "--run-dir", str(run)]) == 0
    return (run / jr.JOURNAL).read_bytes().splitlines(keepends=True)


@_FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["replace", "insert", "drop"]),
                                _JSON | _mutated({"type": "result", "seq": 0, "genome": "0-0-0-0-0-0-1",
                                                  "fitness": 0.5, "source": "train", "status": "ok"})),
                      min_size=1, max_size=2))
def test_fuzzed_search_journal_is_replayed_or_one_journal_error(search_journal, edits, tmp_path):
    lines = list(search_journal)
    for at, how, value in edits:
        i = 1 + at % max(1, len(lines) - 1)  # the start line stays: the config is fuzzed above
        line = (json.dumps(value) + "\n").encode()
        if how == "replace" and i < len(lines):
            lines[i] = line
        elif how == "insert":
            lines.insert(i, line)
        elif i < len(lines):
            del lines[i]
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / jr.JOURNAL).write_bytes(b"".join(lines))
    search = None
    try:
        search = Search(SearchConfig.from_mapping(Search.config_from_journal(run)), run, progress=False)
        search.resume()
    except ValueError as exc:  # JournalError included: the CLI prints it as one line
        assert str(exc).strip()
        event(type(exc).__name__)
        return
    finally:
        if search is not None and search.journal is not None:
            search.journal.close()
    event("replayed")
