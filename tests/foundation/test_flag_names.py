"""One set of names on the command line (issue 30): walks every command's parser (sub-commands of
``data`` and ``hf`` too). A flag name means one thing in every command that has it (the table
below for the names that were ambiguous, the same dest for every other shared name); every command
that writes a file takes ``-o/--output``; old spellings still work, the renamed ones say the new
name; and a mistyped flag gets the nearest-flag line in every command."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hexiscale.cli.flag_names import Renamed, renamed_notes
from hexiscale.cli.main import build_parser, main
from planner.seed_batch import TotalBatch

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(words), parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*words, name))


COMMANDS = dict(_commands(build_parser()))
Check = Callable[[argparse.Action], bool]
# name -> (its one meaning, how an action with that meaning looks)
MEANINGS: dict[str, tuple[str, Check]] = {
    "-o": ("the file (or stem, folder) the command writes", lambda a: a.dest == "output" and a.nargs is None),
    "--global-batch-size": ("samples per step, the total over every pipeline",
                            lambda a: a.type is int and (a.dest == "global_batch" or isinstance(a, TotalBatch))),
    "--pipeline-batch-sizes": ("samples per step of each pipeline",
                               lambda a: a.dest == "global_bsz_size" and a.nargs == "+"
                               and not isinstance(a, TotalBatch)),
    "--pipeline-micro-batches": ("micro-batches of each pipeline", lambda a: a.dest == "chunks" and a.nargs == "+"),
    "--micro-batch-sizes": ("samples per micro-batch (a list to measure)", lambda a: a.dest == "micro_batches"),
    "--trace": ("a timing trace of training steps", lambda a: a.dest == "trace"),
    "--elastic-trace": ("the device set of an elastic job, phase by phase", lambda a: a.dest == "elastic_trace"),
    "--dtype": ("a floating-point compute or weights type",
                lambda a: set(a.choices or ()) <= {"fp32", "bf16", "fp16"}),
    "--seq-len": ("tokens per sequence", lambda a: a.dest == "seq_len" and a.type is int),
    "--steps": ("optimizer steps", lambda a: a.dest == "steps" and a.type is int),
}
MEANINGS["--output"] = MEANINGS["-o"]
MEANINGS["--global-batch"] = MEANINGS["--global-batch-size"]
# old spellings whose name means something else elsewhere: hidden, and they say the new name
RENAMED = {("launch", "--trace"): "--elastic-trace", ("profile", "--micro-batches"): "--micro-batch-sizes",
           ("data pack", "--dtype"): "--token-dtype"}
# commands that write files: -o names what they write
WRITERS = {"plan", "estimate", "convert", "profile", "launch", "data prep", "data pack", "data lengths",
           "data packing", "hf import", "hf export"}
# commands that write no file, or only under flags named for what they write
NOT_WRITERS = {"calibrate": "installs a calibration in its --home", "show": "--plot DIR",
               "train": "--checkpoint-dir, --log-jsonl, --trace, --tensorboard", "whatif": "prints",
               "validate": "prints", "devices": "prints", "data info": "prints", "elastic": "asks a job"}


def _uses() -> dict[str, list[tuple[str, argparse.Action]]]:
    out = defaultdict(list)
    for command, parser in COMMANDS.items():
        for action in parser._actions:
            if not isinstance(action, Renamed):
                for name in action.option_strings:
                    out[name].append((command, action))
    return out


def test_a_flag_name_means_one_thing_in_every_command() -> None:
    wrong = [f"{command} {name}: not {MEANINGS[name][0]}" for name, uses in _uses().items() if name in MEANINGS
             for command, action in uses if not MEANINGS[name][1](action)]
    assert wrong == []
    shared = {name: {a.dest for _, a in uses} for name, uses in _uses().items() if name not in MEANINGS}
    assert {name: dests for name, dests in shared.items() if len(dests) > 1} == {}


def test_every_command_that_writes_a_file_takes_dash_o() -> None:
    assert set(COMMANDS) == WRITERS | set(NOT_WRITERS)
    with_o = {c for c, p in COMMANDS.items() if any(a.option_strings[:2] == ["-o", "--output"] for a in p._actions)}
    assert with_o == WRITERS


def test_renamed_spellings_are_hidden_and_name_the_new_flag() -> None:
    found = {(c, name): a for c, p in COMMANDS.items() for a in p._actions if isinstance(a, Renamed)
             for name in a.option_strings}
    assert {k: a.new for k, a in found.items()} == RENAMED
    for (command, _), action in found.items():
        new = next(a for a in COMMANDS[command]._actions if action.new in a.option_strings)
        assert action.help == argparse.SUPPRESS and action.dest == new.dest


def test_old_spellings_still_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("-o", "--output", "--save"):
        out = tmp_path / f"plan{flag}.json"
        assert main(["estimate", str(PLAN), "--json", flag, str(out)]) == 0
        assert json.loads(out.read_text())["estimate"]["step_time_s"] > 0
    assert "note:" not in capsys.readouterr().err  # plain aliases: no note
    npy = tmp_path / "ids.txt"
    npy.write_text("1 2 3\n4 5\n")
    assert main(["data", "pack", str(npy), "-o", str(tmp_path / "t"), "--dtype", "uint32"]) == 0
    said = capsys.readouterr()
    assert said.err.strip() == "note: hexiscale data pack --dtype is now --token-dtype (the old name still works)"
    assert "5 uint32 tokens" in " ".join(said.out.split())
    args, _ = build_parser().parse_known_args(["launch", "p.json", "--trace", "t.yaml"])
    assert args.elastic_trace == "t.yaml"
    assert renamed_notes(args) == ["hexiscale launch --trace is now --elastic-trace (the old name still works)"]


def _mistyped(flag: str) -> str:
    """``flag`` with its last two letters swapped (``--cluster`` -> ``--clustre``)."""
    return flag[:-2] + flag[-1] + flag[-2]


def _first_long_flag(parser: argparse.ArgumentParser) -> str:
    return next(s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings
                if s.startswith("--") and s != "--help" and len(s) >= 7 and s[-1] != s[-2])


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"devices"}))  # devices takes no flag
def test_a_mistyped_flag_names_the_nearest_one_in_every_command(command: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    flag = _first_long_flag(COMMANDS[command])
    typo = _mistyped(flag)
    assert main([*command.split(), typo, "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {typo}: 'hexiscale {command}' has no such flag (hint: did you mean {flag}?)"


@pytest.mark.parametrize(("argv", "flag"), [
    (["train", "--steps", "3", "4"], "--steps"),
    (["plan", "c.yaml", "--model", "tiny", "--seq-len=16", "32"], "--seq-len"),
    (["launch", str(PLAN), "--python", "/usr/bin/python3", "x"], "--python"),
])
def test_a_second_value_names_the_flag_and_its_meaning(argv: list[str], flag: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    action = next(a for a in COMMANDS[argv[0]]._actions if flag in a.option_strings)
    assert err.startswith(f"error: {flag}: takes one value, and '{argv[-1]}' follows it (hint: {flag}: ")
    assert (action.help or "").split("(")[0] in err and "\n" not in err
