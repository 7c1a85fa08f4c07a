"""What the docs tell users to type is what the commands take: every ``python -m`` command line of
README.md and docs/*.md parses with that command's own parser, and every inline ```--flag value```
is a value its command accepts. (evidence.md wrote ``--promote 1/3``, the help said "default
1/3", and both parsers refused ``1/3``.) Parsing only: nothing runs; a command's ``main`` stops at
its parser (``parse_args`` patched), so what it would check after parsing is its own tests' job."""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Each command the docs may show, and the module whose main(argv) is its command line.
MAINS = {"bnn.train": "bnn.train.cli", "bnn.search": "bnn.search.cli", "bnn.evidence": "bnn.evidence.grid",
         "bnn.diagnose": "bnn.diagnose.cli", "bnn.export": "bnn.export.cli", "bnn.reproduce": "bnn.reproduce",
         "bnn.search.calibrate": "bnn.search.calibrate", "bnn.search.cost": "bnn.search.cost",
         "refimpl.infer": "refimpl.infer", "refimpl.info": "refimpl.info", "refimpl.codegen": "refimpl.codegen"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
COMMAND = re.compile(r"python3? -m ((?:bnn|refimpl)(?:\.\w+)*)(.*)")
INLINE_COMMAND = re.compile(r"`(python3? -m (?:bnn|refimpl)[^`]*)`")
FLAG_SPAN = re.compile(r"`(--[a-z][\w-]*)[ =]([^`\s]+)`")
# A value that stands for the user's own: DIR, N, K, f, E:N[:K], {a,b}, ...
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|^[a-z]$|\.\.\.|[{}\[\]<>]")


_PARSE = argparse.ArgumentParser.parse_args  # the real one, called by the patched one


class _Parsed(Exception):
    pass


class _Refused(Exception):
    pass


def _refuse(message):
    raise _Refused(message)


def _stop_after_parsing(self, args=None, namespace=None):
    self.error = _refuse  # on the instance: a command's own parser class may override error too
    raise _Parsed(_PARSE(self, args, namespace))


def _parse(command: str, argv: list[str]) -> str | None:
    """None if ``python -m command argv`` parses; else the parser's complaint."""
    main = importlib.import_module(MAINS[command]).main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", _stop_after_parsing):
        try:
            main(argv)
        except _Parsed:
            return None
        except _Refused as exc:
            return str(exc)
        except SystemExit as exc:  # --help
            return None if exc.code in (0, None) else f"exit {exc.code}"
    return "main returned without parsing"


def command_lines(text: str) -> list[tuple[str, str, str]]:
    """``(kind, command, arguments)`` of each ``python -m`` line: in code blocks (``VAR="..."``
    expanded where a line uses ``$VAR``, a ``for v in A ...`` loop's ``$v`` as its first value,
    ``&&``/``;``/``|`` chains split) as "block", and inline code spans with arguments as "inline"
    (usage synopses with ``[`` or `` | `` left out)."""
    found = []
    for block in FENCE.findall(text):
        env: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            if m := re.match(r'^\s*([A-Za-z_]\w*)="([^"]*)"\s*$', line):
                env[m.group(1)] = m.group(2)
                continue
            if m := re.match(r"^\s*for (\w+) in (\S+)", line):
                env[m.group(1)] = m.group(2)
            for name in sorted(env, key=len, reverse=True):
                line = line.replace("$" + name, env[name])
            for part in re.split(r"&&|;|\|", line):
                if m := COMMAND.search(part):
                    found.append(("block", m.group(1), m.group(2)))
    for span in INLINE_COMMAND.findall(FENCE.sub("", text)):
        m = COMMAND.search(span)
        if re.match(r"\s+\S", m.group(2)) and not re.search(r"\[|\s\|\s", span):  # not `python -m bnn.*`
            found.append(("inline", m.group(1), m.group(2)))
    return found


def argv_of(arguments: str) -> list[str]:
    """The arguments as the shell would pass them: a trailing comment and redirections cut off."""
    arguments = re.sub(r"\s#.*$", "", arguments)
    return shlex.split(re.split(r"\s(?:>|2>|<)\S*", arguments)[0])


def line_problems(text: str) -> tuple[int, list[str]]:
    checked, problems = 0, []
    for kind, command, arguments in command_lines(text):
        if command not in MAINS:
            problems.append(f"python -m {command}: not a command this test knows (add it to MAINS)")
            continue
        argv = argv_of(arguments)
        if any("$" in a for a in argv):
            problems.append(f"python -m {command} {arguments.strip()}: a $variable this test cannot expand")
            continue
        checked += 1
        why = _parse(command, argv)
        # An inline span shows some of a command's arguments: what it leaves out is not its error.
        if why and not (kind == "inline" and re.search(r"\b(are|is) required", why)):
            problems.append(f"python -m {command} {' '.join(argv)}: {why}")
    return checked, problems


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, as its ``main`` builds it."""
    found = {}

    def grab(self, args=None, namespace=None):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
        for command, module in MAINS.items():
            with pytest.raises(_Parsed) as got:
                importlib.import_module(module).main([])
            found[command] = got.value.args[0]
    return found


def flag_problems(text: str, parsers) -> tuple[int, list[str]]:
    """Inline ``--flag value`` spans (outside code blocks) whose value no command with that flag takes."""
    checked, problems = 0, []
    for flag, value in FLAG_SPAN.findall(FENCE.sub("", text)):
        owners = {c: p._option_string_actions[flag] for c, p in parsers.items() if flag in p._option_string_actions}
        if not owners or PLACEHOLDER.search(value):
            continue  # a bench script's or pytest's flag, or the user's own value
        checked += 1
        complaints = []
        for command, action in owners.items():
            try:
                if action.nargs == 0:
                    raise ValueError("takes no value")
                parsed = action.type(value) if action.type else value
                if action.choices is not None and parsed not in action.choices:
                    raise ValueError(f"not one of {sorted(action.choices)}")
                break
            except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
                complaints.append(f"{command}: {exc}")
        else:
            problems.append(f"`{flag} {value}`: " + "; ".join(complaints))
    return checked, problems


def test_every_command_line_of_the_docs_parses():
    checked, problems = 0, []
    for page in PAGES:
        n, found = line_problems(page.read_text(encoding="utf-8"))
        checked += n
        problems += [f"{page.relative_to(ROOT)}: {p}" for p in found]
    assert problems == []
    assert checked >= 25  # the README's two commands, its evidence commands, evidence.md's plans...


def test_every_inline_flag_value_of_the_docs_is_accepted(parsers):
    checked, problems = 0, []
    for page in PAGES:
        n, found = flag_problems(page.read_text(encoding="utf-8"), parsers)
        checked += n
        problems += [f"{page.relative_to(ROOT)}: {p}" for p in found]
    assert problems == []
    assert checked >= 40


def test_the_checks_find_what_a_page_gets_wrong(parsers):
    page = """
Run `python -m bnn.search --promote 3/2` or `--promote 0` but not `--workers 2`, and
`python -m bnn.search --dataset fashion-mnist` (good), `--counts laplace` (good).

```bash
E="python -m bnn.evidence --seeds 0,1 --jobs"
for s in 0 1; do $E 0; done
python -m bnn.train --epochs 2 && python -m bnn.nothing --x
python -m bnn.export CHECKPOINT   # -o missing
```
"""
    checked, problems = line_problems(page)
    assert checked == 5 and len(problems) == 4, problems
    assert "bnn.evidence --seeds 0,1 --jobs 0" in problems[0] and "positive integer" in problems[0]
    assert "bnn.nothing" in problems[1] and "-o/--out" in problems[2]
    assert "bnn.search --promote 3/2" in problems[3] and "fraction" in problems[3]
    checked, problems = flag_problems(page, parsers)
    assert checked == 3 and [p.split("`")[1] for p in problems] == ["--promote 0"]


def test_python_m_bnn_and_refimpl_list_every_documented_command_and_each_parses_help(capsys):
    from bnn.__main__ import COMMANDS as BNN
    from refimpl.cli import COMMANDS as REFIMPL
    from refimpl.cli import command_index

    assert {name for name, _ in BNN + REFIMPL} == set(MAINS)  # a new command is listed where users look
    for name, _ in BNN + REFIMPL:
        assert _parse(name, ["--help"]) is None, name
    capsys.readouterr()  # the --help pages
    assert command_index("bnn", "Commands:", BNN, []) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Commands:" and [line.split()[0] for line in out[1:]] == [name for name, _ in BNN]
    assert command_index("bnn", "Commands:", BNN, ["train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "python -m bnn.train" in err[0]


@pytest.mark.parametrize("dataset, counts, downsample, commands", [
    ("digits", "raw", "binary", ["bnn.evidence"]),
    ("fashion-mnist", "laplace", "binary", ["bnn.evidence", "bnn.evidence"]),  # XNOR on raw counts, the finds on theirs
    ("cifar10", "laplace", "binary", ["bnn.evidence", "bnn.evidence"]),
    ("cifar100", "raw", "binary", ["bnn.evidence"]),
    ("mnist", "raw", "real", ["bnn.train", "bnn.train"]),
])
def test_a_finished_search_prints_next_steps_that_parse(tmp_path, dataset, counts, downsample, commands):
    from types import SimpleNamespace

    from bnn.search.loop import SearchConfig
    from bnn.search.report import next_steps

    rows = [{"genome": "0-0-0-0-0-0-1", "name": "baseline"}] + [{"genome": g, "name": None} for g in
                                                               ("16-4-4-12-10-4-2", "3-4-5-6-1-2-3", "1-1-1-1-1-1-1", "2-2-2-2-2-2-2")]
    cfg = SearchConfig(dataset=dataset, model="mnist_net", counts=counts, downsample=downsample, data_dir="my data")
    search = SimpleNamespace(cfg=cfg, leaderboard=lambda: rows, run_dir=tmp_path / "run")
    lines = next_steps(search)
    assert lines[0].startswith("next:")
    printed = [shlex.split(line.strip()) for line in lines[1:]]
    assert [argv[2] for argv in printed] == commands
    for argv in printed:
        assert argv[:2] == ["python", "-m"] and _parse(argv[2], argv[3:]) is None, argv
        assert argv[argv.index("--data-dir") + 1] == "my data"  # the search's own data, quoted
    measures = ",".join(argv[argv.index("--measures") + 1] for argv in printed if "--measures" in argv)
    if commands[0] == "bnn.evidence":  # XNOR and the three best, none twice
        assert sorted(measures.split(",")) == sorted(["baseline", "16-4-4-12-10-4-2", "3-4-5-6-1-2-3", "1-1-1-1-1-1-1"])
    assert next_steps(SimpleNamespace(cfg=SearchConfig(fitness="synthetic:1"), leaderboard=lambda: rows,
                                      run_dir=tmp_path)) == []


def _parser_of(command: str) -> argparse.ArgumentParser:
    """The parser a command's main builds, caught as it parses."""
    caught = []

    def catch(self, args=None, namespace=None):
        caught.append(self)
        raise _Parsed(None)

    main = importlib.import_module(MAINS[command]).main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            main([])
        except _Parsed:
            pass
    return caught[0]


@pytest.mark.parametrize("command", sorted(MAINS))
def test_every_command_that_reads_a_data_set_spells_it_alike(command):
    # README, "Every command that reads a data set spells it alike": --dataset, --data-dir and --download.
    options = {o for a in _parser_of(command)._actions for o in a.option_strings}
    if "--dataset" in options:
        assert {"--data-dir", "--download"} <= options, command
