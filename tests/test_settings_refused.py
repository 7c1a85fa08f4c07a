"""Settings that can never work are refused before anything runs or is written (issue 18 items 8
and 11): one line naming the option, the bad value and the valid range, exit status 2, no
traceback, no run folder. In process (``main(argv)`` is what ``python -m`` calls), so an exception
escaping ``main`` is the traceback a user would see."""
import argparse

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bnn import evidence, reproduce
from bnn import train as bnn_train
from bnn.search import cli as search_cli
from refimpl import infer
from refimpl.cli import fraction, nearest_option, parse_int, positive_float

U64_MAX = "18446744073709551615"  # 2**64 - 1: past int64, which torch and NumPy seeds are
DIGITS_TRAIN = 1437  # 1797 digits less the 360 of the test split (refimpl/datasets/digits.py)
NO_CUDA_9 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() > 9,
                               reason="this machine has a cuda:9")


def _run(main, argv, capsys) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit from inside parse_args
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


def _refused(main, argv, capsys, *words) -> str:
    code, lines = _run(main, argv, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The shared checkers (refimpl/cli.py)


@pytest.mark.parametrize("text", ["-1", "1.5", "", "x", "٣", "３", "1e3", "2**3"])
def test_parse_int_takes_ascii_whole_numbers_in_range_only(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer >= 0"):
        parse_int(text, 0)


def test_parse_int_bounds_are_inclusive_and_name_the_range():
    assert parse_int(" 7 ", 0, 7) == 7 and parse_int("0", 0, 7) == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"in 0\.\.2\*\*63-1, got '" + U64_MAX):
        parse_int(U64_MAX, 0, 2**63 - 1)


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "0", "-1", "1e999", "x", "１"])
def test_positive_float_refuses_what_is_not_finite_and_positive(text):
    with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0"):
        positive_float(text)
    assert positive_float("5e-3") == 0.005


@pytest.mark.parametrize("text", ["0", "0/3", "3/2", "1.5", "-1/3", "1/0", "nan", "inf", "x", "1/3x", "１/3", ""])
def test_fraction_refuses_what_is_not_in_zero_to_one(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"fraction in \(0, 1\]"):
        fraction(text)


def test_fraction_takes_the_docs_ratio_form_and_decimals():
    # The docs write --promote 1/3 (the default): it must be the same double as the default 1 / 3.
    assert fraction("1/3") == 1 / 3 and fraction(" 2/4 ") == 0.5 and fraction("0.25") == 0.25 and fraction("1") == 1.0
    assert search_cli.build_parser().parse_args(["--promote", "1/3"]).promote == 1 / 3


@pytest.mark.parametrize("word, meant", [
    ("--out-dir", "--out"),          # a known option with more after a hyphen
    ("--seeds", "--seed"),           # a plural of a known option
    ("--data_dir", "--data-dir"),    # underscores for hyphens
    ("--coutns", "--counts"),        # a transposition
    ("--zzz", None),                 # nothing near
])
def test_nearest_option_names_what_a_mistyped_option_meant(word, meant):
    known = ["--out", "--overwrite", "--seed", "--data-dir", "--dataset", "--counts", "--help"]
    assert nearest_option(word, known) == meant


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12), st.lists(st.from_regex(r"--[a-z]{2,6}(-[a-z]{2,5})?", fullmatch=True), min_size=1,
                                      max_size=8, unique=True))
def test_nearest_option_answers_a_known_option_or_none_and_each_known_one_itself(tail, known):
    assert nearest_option("--" + tail, known) in [*known, None]
    for k in known:
        assert nearest_option(k, known) == k and nearest_option(k.replace("-", "_").replace("__", "--", 1), known) == k


@pytest.mark.parametrize("main, argv, said", [
    (bnn_train.main, ["--out-dir", "x"], "did you mean --out for --out-dir?"),
    (search_cli.main, ["--run_dir", "x", "--populaton", "3"],
     "did you mean --run-dir for --run_dir, --population for --populaton?"),
    (evidence.main, ["--root-dir", "x"], "did you mean --root for --root-dir?"),
])
def test_an_unknown_option_is_refused_naming_the_one_meant(tmp_path, capsys, monkeypatch, main, argv, said):
    monkeypatch.chdir(tmp_path)
    assert said in _refused(main, argv, capsys, "unrecognized arguments")
    assert list(tmp_path.iterdir()) == []  # nothing made


# ---------------------------------------------------------------------------------------------
# Every command that makes a folder: bnn.train, bnn.search, bnn.reproduce, bnn.evidence

# Each command's main and the arguments it runs with, FOLDER standing for the folder it would make
# and DATA for its data folder; the refused setting comes after them (argparse keeps the last value).
FOLDER, DATA = "<folder>", "<data>"
COMMANDS = {
    "train": (bnn_train.main, ["--out", FOLDER, "--no-progress"]),
    "search": (search_cli.main, ["--run-dir", FOLDER, "--no-progress"]),
    "reproduce": (reproduce.main, ["--cells", "cifar10/nin/baseline", "--root", FOLDER, "--data-dir", DATA,
                                   "--epochs", "1", "--no-progress"]),
    "evidence": (evidence.main, ["--dataset", "digits", "--epochs", "1", "--root", FOLDER, "--no-progress"]),
}


@pytest.mark.parametrize("command, args, words", [
    ("train", ["--val-size", "-5"], ["--val-size", "'-5'", ">= 0"]),
    ("train", ["--val-size", "99999"], ["val_size", "99999", f"0..{DIGITS_TRAIN - 1}"]),
    ("train", ["--train-size", "99999"], ["train_size", "99999", "1.."]),
    ("train", ["--seed", U64_MAX], ["--seed", U64_MAX, "0..2**63-1"]),
    ("train", ["--seed", "-1"], ["--seed", "'-1'", "0..2**63-1"]),
    ("train", ["--device", "tpu"], ["'tpu'", "auto, cpu, cuda or cuda:N"]),
    pytest.param("train", ["--device", "cuda:9"], ["cuda:9"], marks=NO_CUDA_9),
    ("train", ["--lr", "inf"], ["--lr", "'inf'", "finite number > 0"]),
    ("train", ["--lr", "nan"], ["--lr", "'nan'", "finite number > 0"]),
    ("train", ["--lr", "0"], ["--lr", "finite number > 0"]),
    ("train", ["--epochs", "0"], ["--epochs", "positive integer"]),
    ("train", ["--epochs", "３"], ["--epochs", "positive integer"]),
    ("train", ["--batch-size", "-2"], ["--batch-size", "positive integer"]),
    ("search", ["--val-size", "-5"], ["--val-size", "'-5'"]),
    ("search", ["--val-size", "99999"], ["val_size", "99999", f"0..{DIGITS_TRAIN - 1}"]),
    ("search", ["--train-size", "99999"], ["train_size", "99999"]),
    ("search", ["--train-seed", U64_MAX], ["--train-seed", U64_MAX, "0..2**63-1"]),
    ("search", ["--seed", "-1"], ["--seed", "0..2**63-1"]),
    ("search", ["--device", "tpu"], ["'tpu'", "cuda:N"]),
    pytest.param("search", ["--device", "cuda:9"], ["cuda:9"], marks=NO_CUDA_9),
    ("search", ["--max-minutes", "inf"], ["--max-minutes", "'inf'", "finite number > 0"]),
    ("search", ["--max-minutes", "nan"], ["--max-minutes", "'nan'"]),
    ("search", ["--max-minutes", "-1"], ["--max-minutes", "'-1'"]),
    ("search", ["--lr", "inf"], ["--lr", "'inf'"]),
    ("search", ["--epochs", "0"], ["--epochs", "positive integer"]),
    ("reproduce", ["--device", "tpu"], ["'tpu'"]),
    ("reproduce", ["--seed", U64_MAX], ["--seed", "0..2**63-1"]),
    ("reproduce", ["--epochs", "0"], ["--epochs", "positive integer"]),
    ("reproduce", ["--val-size", "-5"], ["--val-size", "'-5'"]),
    ("evidence", ["--val-size", "99999"], ["val_size", "99999", f"0..{DIGITS_TRAIN - 1}"]),
    ("evidence", ["--seeds", f"0,{U64_MAX}"], ["--seeds", U64_MAX, "0..2**63-1"]),
    ("evidence", ["--lr", "inf"], ["--lr", "'inf'"]),
    ("evidence", ["--device", "tpu"], ["'tpu'"]),
    ("evidence", ["--jobs", "0"], ["--jobs", "positive integer"]),
])
def test_a_command_refuses_a_setting_before_making_its_folder(tmp_path, capsys, command, args, words):
    main, argv = COMMANDS[command]
    folder = tmp_path / "folder"
    given = {FOLDER: str(folder), DATA: str(tmp_path)}
    _refused(main, [*(given.get(a, a) for a in argv), *args], capsys, *words)
    assert not folder.exists()


# ---------------------------------------------------------------------------------------------
# bnn.train and bnn.search: --resume, and the training API


@pytest.mark.parametrize("extra", [["--measure", "M1"], ["--out", "elsewhere"], ["--seed", "0"], ["--lr", "0.1"]])
def test_train_resume_with_a_setting_it_would_ignore_is_refused(tmp_path, capsys, extra):
    _refused(bnn_train.main, ["--resume", str(tmp_path / "run"), *extra], capsys, "--resume", extra[0])
    assert not (tmp_path / "run").exists() and not (tmp_path / "elsewhere").exists()


def test_train_config_refuses_what_the_api_would_truncate_or_overflow():
    for bad in (dict(seed=2**64 - 1), dict(lr=float("inf")), dict(lr=float("nan")), dict(epochs=2.5),
                dict(val_size=-5), dict(device="tpu"), dict(gamma=float("nan"))):
        with pytest.raises(ValueError, match=next(iter(bad)) if "device" not in bad else "tpu"):
            bnn_train.TrainConfig(**bad).validate()


@pytest.mark.parametrize("extra", [["--run-dir", "new"], ["--preset", "digits"]])
def test_search_resume_with_a_new_run_flag_is_refused(tmp_path, capsys, extra):
    argv = ["--resume", str(tmp_path / "old"), *[str(tmp_path / v) if v == "new" else v for v in extra]]
    _refused(search_cli.main, argv, capsys, "--resume", extra[0])
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------
# refimpl.infer: flags that a data set makes meaningless


@pytest.mark.parametrize("extra, flag", [(["--labels", "y.npy"], "--labels"), (["--normalized"], "--normalized")])
@pytest.mark.parametrize("source", [["--digits"], ["--dataset", "digits"], ["--cifar", "somewhere"]])
def test_infer_refuses_input_only_flags_with_a_data_set(tmp_path, capsys, source, extra, flag):
    _refused(infer.main, [str(tmp_path / "m.bnn"), *source, *extra], capsys, flag, "--input")
