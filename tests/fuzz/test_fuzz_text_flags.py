"""Every text-valued flag and positional (paths, names, ids, lists, KEY=VALUE) of every sub-command,
fuzzed with hostile text: shell syntax, ``..``, markup, control characters, long values, existing
folders, a file of garbage and a FIFO that nobody reads or writes. Each ends in exit 0, exit 2
(argparse) or exit 1 with one line naming the flag or the value, never a traceback or a hang; no
shell ever runs a value; nothing is written outside the case's folder. (``train``'s output paths
are checked in pre-flight: tests/faults/test_train_flags.py; commands that would measure or
search first check every number, tests/fuzz/test_fuzz_flags.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from planner.model import PRESETS
from tests.support.cli_run import run_cli
from tests.support.fuzz_settings import fuzz

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
SEED = ["--hetero_configs", "[[2], [1, 2, 1]]", "--layer_partitions", "[[4], [1, 2, 1]]", "--global_bsz_size", "5",
        "3", "--chunks", "2", "3"]
WHATIF = ["whatif", PLAN, "--cluster", CLUSTER]
LAUNCH = ["launch", PLAN, "--cluster", CLUSTER]
V = "VALUE"
# (argv with VALUE where the fuzzed text goes, whether the command may write files at that value)
CASES: dict[str, tuple[list[str], bool]] = {
    "validate FILE": (["validate", "--", V], False),
    "validate --cluster": (["validate", PLAN, f"--cluster={V}"], False),
    "show FILE": (["show", "--", V], False),
    "estimate PLAN": (["estimate", "--cluster", CLUSTER, "--", V], False),
    "estimate --cluster": (["estimate", PLAN, f"--cluster={V}"], False),
    "estimate --params": (["estimate", PLAN, "--cluster", CLUSTER, f"--params={V}"], False),
    "estimate --save": (["estimate", PLAN, "--cluster", CLUSTER, f"--save={V}"], True),
    "whatif --remove-node": ([*WHATIF, f"--remove-node={V}"], False),
    "whatif --add-node": ([*WHATIF, f"--add-node={V}"], False),
    "whatif --link": ([*WHATIF, f"--link={V}"], False),
    "whatif --cap": ([*WHATIF, f"--cap={V}"], False),
    "whatif --slowdown": ([*WHATIF, f"--slowdown={V}"], False),
    "launch PLAN": (["launch", "--cluster", CLUSTER, "--dry-run", "--", V], False),
    "launch --cluster": (["launch", PLAN, "--dry-run", f"--cluster={V}"], False),
    "launch --node": ([*LAUNCH, "--dry-run", f"--node={V}"], False),
    "launch --master": ([*LAUNCH, "--dry-run", f"--master={V}"], False),
    "launch --run-id": ([*LAUNCH, "--dry-run", f"--run-id={V}"], False),
    "launch --python": ([*LAUNCH, "--dry-run", f"--python={V}"], False),
    "launch --log-dir": ([*LAUNCH, "--dry-run", f"--log-dir={V}"], False),
    "launch --env": ([*LAUNCH, "--dry-run", f"--env={V}"], False),
    "launch --nccl-socket-ifname": ([*LAUNCH, "--dry-run", f"--nccl-socket-ifname={V}"], False),
    "launch --gloo-socket-ifname": ([*LAUNCH, "--dry-run", f"--gloo-socket-ifname={V}"], False),
    "launch --nccl-ib-hca": ([*LAUNCH, "--dry-run", f"--nccl-ib-hca={V}"], False),
    "launch --sm-percent": (["launch", PLAN, "--local", "--dry-run", "--device", "cuda", f"--sm-percent={V}"], False),
    "launch -o": ([*LAUNCH, f"-o={V}"], True),
    "launch --slurm -o": ([*LAUNCH, "--slurm", f"-o={V}"], True),
    "launch -- TRAIN ARGS": ([*LAUNCH, "--dry-run", "--", "--data", V], False),
    "plan CLUSTER": (["plan", "--model", "tiny", "--global-batch", "8", "--", V], False),
    "plan --model": (["plan", CLUSTER, "--global-batch", "8", f"--model={V}"], False),
    "profile --model": (["profile", "--cpu", "--quiet", f"--model={V}"], False),
    "profile --micro-batches": (["profile", "--model", "no-such-model", "--cpu", f"--micro-batches={V}"], False),
    "profile --seq-lens": (["profile", "--model", "no-such-model", "--cpu", f"--seq-lens={V}"], False),
    "profile --tp": (["profile", "--model", "no-such-model", "--cpu", f"--tp={V}"], False),
    "profile --key": (["profile", "--model", "no-such-model", "--cpu", f"--key={V}"], False),
    "calibrate --model": (["calibrate", "--cpu", "--quiet", f"--model={V}"], False),
    "data info PATH": (["data", "info", "--", V], False),
    "data pack INPUT": (["data", "pack", "-o", "packed", "--", V], False),
    "data pack -o": (["data", "pack", "tokens.txt", f"-o={V}"], True),
    "convert --to-flags": (["convert", "--cluster", CLUSTER, f"--to-flags={V}"], False),
    "convert --cluster": (["convert", "--from-flags", "--model", "tiny", *SEED, f"--cluster={V}"], False),
    "convert --model": (["convert", "--from-flags", "--cluster", CLUSTER, *SEED, f"--model={V}"], False),
    "convert -o": (["convert", "--from-flags", "--cluster", CLUSTER, "--model", "tiny", *SEED, f"-o={V}"], True),
    "convert --devices_id": (["convert", "--from-flags", "--cluster", CLUSTER, "--model", "tiny", *SEED,
                              f"--devices_id={V}"], False),
    "train --plan": (["train", f"--plan={V}"], False),
    "train --cluster": (["train", "--plan", PLAN, f"--cluster={V}"], False),
    "train --model": (["train", "--cluster", CLUSTER, *SEED, f"--model={V}"], False),
}


def _seed_without(flag: str) -> list[str]:
    """The seed-style flags less ``flag`` and its value."""
    i = SEED.index(flag)
    return SEED[:i] + SEED[i + 2:]


for _flag in ("--hetero_configs", "--layer_partitions"):
    CASES[f"convert {_flag}"] = (["convert", "--from-flags", "--cluster", CLUSTER, "--model", "tiny",
                                  *_seed_without(_flag), f"{_flag}={V}"], False)

SPECIAL = ["$(touch pwned)", "`touch pwned`", "a;touch pwned", "../../x", "..", ".", "-", "--", "[/x]", "[bold]x",
           ":smile:", "a b", "a\nb", "a\tb", "\r", "x" * 300, "folder", "garbage.json", "fifo", "tokens.txt",
           "a=b", "=", "a=", "=1", "a100:0=2", "a100,r4090=1", "a100", "r4090:9", ":", "h:0", "h:70000", "[[1]]",
           "[[", "1,2", "0", "-1", "1e400", "nan", "é", "\x7f", "~", "*", "$HOME", "{a,b}", "'", '"']
hostile = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=12),
                    st.text(alphabet="$`'\" ;&|<>*?~{}\\#[]/.:=,-_ab01\n", max_size=12))


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder three levels deep (``../../x`` stays inside the test's folder) holding an
    existing folder, a file of garbage, a FIFO and a token list."""
    work = tmp_path / "a" / "b" / "c"
    (work / "folder").mkdir(parents=True)
    (work / "garbage.json").write_bytes(b"\xff\xfe{[not json")
    os.mkfifo(work / "fifo")
    (work / "tokens.txt").write_text("1 2 3 4\n5 6 7\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("WORLD_SIZE", "999")  # a train that got this far stops at the world size check
    return tmp_path


def _inside(root: Path, value: str) -> bool:
    return os.path.normpath(os.path.join(os.getcwd(), value)).startswith(str(root) + os.sep)


def _shown(value: str) -> str:
    """How a value appears in a one-line message (line breaks become spaces, other control
    characters are escaped: planner.errors.SpecError)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(value.splitlines())).strip()


# what a message names when the value was accepted and a later check (the same for every value) failed
# (launch checks the train arguments as 'hexiscale train' parses them, then as script text)
LATER = {"profile --key": ("--model: 'no-such-model'",), "profile --seq-lens": ("--model: 'no-such-model'",),
         "profile --tp": ("--model: 'no-such-model'",), "profile --micro-batches": ("--model: 'no-such-model'",),
         "launch -- TRAIN ARGS": ("train arguments[1]", "argument --data:")}


@pytest.mark.parametrize("case", sorted(CASES))
@fuzz(80)
@given(value=hostile)
def test_text_values(place: Path, case: str, value: str) -> None:
    argv, writes = CASES[case]
    assume("\0" not in value and value)  # no command line can hold these (tests/fuzz/test_entrypoint.py)
    assume(value not in PRESETS)  # a real model would start a search, a measurement or a calibration
    if writes:
        assume(_inside(place, value))
    outcome = run_cli([a.replace(V, value) for a in argv])
    assert not list(place.rglob("pwned*")), (case, value)
    if outcome.code == 1:
        err = outcome.error
        named = (case.split()[-1], _shown(value), _shown(str(Path(value))), *LATER.get(case, ()))
        assert any(n in err for n in named), (case, value, err)
