"""Every numeric flag of every sub-command, fuzzed as typed: an out-of-range, non-finite or
unreadable value is refused (exit 1 naming the flag, or argparse's exit 2 naming it) before any
work, never accepted; in-range values of the cheap commands run without a traceback or a hang.
Valid values of commands that would train, profile, calibrate or search are not run here."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.cli_run import names, run_cli
from tests.support.fuzz_settings import fuzz

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
YEAR = 365 * 86400.0
BIG = 1 << 24  # MAX_GLOBAL_BATCH, the model limits of seq_len and vocab_size


def ints(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and lo <= v <= hi


def floats(lo: float, hi: float, above: bool = False) -> Callable[[Any], bool]:
    return lambda v: math.isfinite(v) and (v > lo if above else v >= lo) and v <= hi


TRAIN = ["train", "--plan", PLAN]
ESTIMATE = ["whatif", PLAN, "--cluster", CLUSTER]
PROFILE = ["profile", "--model", "tiny", "--cpu", "--quiet", "--out", "TMP/profile.json"]
# (argv before the flag, flag, int or float, in-range test, run in-range values, value template)
FLAGS: list[tuple[list[str], str, type, Callable[[Any], bool], bool, str]] = [
    (["plan", CLUSTER, "--model", "tiny", "--global-batch", "8"], "--global-batch", int, ints(1, BIG), False, "{}"),
    (["plan", CLUSTER, "--model", "tiny", "--global-batch", "8"], "--seq-len", int, ints(1, BIG), False, "{}"),
    (["plan", CLUSTER, "--model", "tiny", "--global-batch", "8"], "--time-limit", float, floats(0, 86400, True),
     False, "{}"),
    (["plan", CLUSTER, "--model", "tiny", "--global-batch", "8"], "--seed", int, ints(0, 2**32 - 1), False, "{}"),
    (ESTIMATE, "--inter-bw", float, floats(1e-6, 1e6), True, "{}"),
    (ESTIMATE, "--global-batch", int, ints(2, BIG), False, "{}"),  # the plan has 2 pipelines
    (ESTIMATE, "--cap", float, floats(0, 1e6, True), True, "a100:0={}"),
    (ESTIMATE, "--slowdown", float, floats(1, 1e6), True, "r4090:1={}"),
    (ESTIMATE, "--link", float, floats(1e-6, 1e6), True, "a100,r4090={}"),
    (["data", "info", "CORPUS"], "--vocab-size", int, ints(1, BIG), True, "{}"),
    (["data", "info", "CORPUS"], "--seq-len", int, ints(1, BIG), True, "{}"),
    (["launch", PLAN, "--cluster", CLUSTER, "--dry-run"], "--grace", int, ints(0, 86400), True, "{}"),
    (["launch", PLAN, "--cluster", CLUSTER, "--dry-run"], "--master", int, ints(1, 65535), True, "h1:{}"),
    (["launch", PLAN, "--local", "--device", "cuda"], "--sm-percent", float, floats(0, 100, True), False,
     "a100={}"),
    (TRAIN, "--steps", int, ints(1, 10**9), False, "{}"),
    (TRAIN, "--save-every", int, ints(0, 10**9), False, "{}"),
    (TRAIN, "--log-every", int, ints(1, 10**9), False, "{}"),
    (TRAIN, "--seed", int, ints(0, 2**63 - 1), False, "{}"),
    (TRAIN, "--warmup", int, ints(0, 10), False, "{}"),  # at most --steps (default 10)
    (TRAIN, "--lr", float, floats(0, math.inf, True), False, "{}"),
    (TRAIN, "--min-lr", float, floats(0, 3e-4), False, "{}"),
    (TRAIN, "--weight-decay", float, floats(0, math.inf), False, "{}"),
    (TRAIN, "--clip", float, floats(-math.inf, math.inf), False, "{}"),
    (TRAIN, "--heartbeat", float, floats(0, 15, True), False, "{}"),  # --dead-after 30 needs two beats
    (TRAIN, "--dead-after", float, floats(2, YEAR), False, "{}"),
    (TRAIN, "--hang-after", float, floats(2, YEAR), False, "{}"),
    (TRAIN, "--startup-timeout", float, floats(0, YEAR, True), False, "{}"),
    (TRAIN, "--pg-timeout", float, floats(1800, YEAR, True), False, "{}"),  # must outlast --hang-after
    (PROFILE, "--seq-len", int, ints(1, BIG), False, "{}"),
    (PROFILE, "--layers", int, ints(1, 10_000), False, "{}"),
    (PROFILE, "--repeats", int, ints(1, 10_000), False, "{}"),
    (PROFILE, "--layer-chain", int, ints(1, 1000), False, "{}"),
    (PROFILE, "--comm-ranks", int, ints(0, 64), False, "{}"),
    (PROFILE, "--sm-percent", float, floats(0, 100, True), False, "{}"),
    (PROFILE, "--micro-batches", int, ints(1, 4096), False, "{}"),
    (PROFILE, "--tp", int, ints(1, 64), False, "{}"),
    (["calibrate", "--cpu", "--quiet", "--home", "TMP"], "--comm-ranks", int, ints(0, 64), False, "{}"),
    (["calibrate", "--cpu", "--quiet", "--home", "TMP"], "--seq-len", int, ints(1, BIG), False, "{}"),
    (["calibrate", "--cpu", "--quiet", "--home", "TMP"], "--max-held-out-error", float, floats(0, 1e4, True), False,
     "{}"),
    (["convert", "--from-flags", "--cluster", CLUSTER, "--model", "tiny", "--hetero_configs", "[[2], [1, 2, 1]]",
      "--layer_partitions", "[[4], [1, 2, 1]]", "--global_bsz_size", "5", "3", "--chunks", "2", "3"],
     "--seq-len", int, ints(1, BIG), True, "{}"),
]

typed = st.one_of(
    st.integers(-3, 70).map(str), st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["0", "-0", "1", "2", "1e400", "-1e400", "nan", "inf", "-inf", "1e-300", "0x10", "1_000", "",
                     " 7 ", "+5", "[/x]", "3.5", "1e30", str(2**63), str(2**64), "65536", "86401", "1800"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6),
)


def parse(text: str, kind: type) -> Any:
    """The value argparse's ``type`` makes of ``text``, or None when it refuses it."""
    try:
        return kind(text)
    except (ValueError, OverflowError):
        return None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    from executor.data.token_file import write_token_file

    stem = tmp_path_factory.mktemp("data") / "corpus"
    write_token_file(stem, [list(range(200))])
    return str(stem)


@pytest.mark.parametrize(("prefix", "flag", "kind", "valid", "run_valid", "template"), FLAGS,
                         ids=[f"{f[0][0]} {f[1]}" for f in FLAGS])
@fuzz(120)
@given(text=typed)
def test_flag_values(corpus: str, monkeypatch: pytest.MonkeyPatch, prefix: list[str], flag: str, kind: type,
                     valid: Callable[[Any], bool], run_valid: bool, template: str, text: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "999")  # a train that got this far stops at the world size check
    value = parse(text, kind)
    in_range = value is not None and valid(value)
    if in_range and not run_valid:
        return
    places = {"CORPUS": corpus, "TMP/profile.json": str(Path(corpus).parent / "profile.json"),
              "TMP": str(Path(corpus).parent)}
    argv = [places.get(a, a) for a in prefix] + [flag, template.format(text)]
    outcome = run_cli(argv)
    if not in_range:
        assert outcome.code in (1, 2) and names(outcome, flag), (argv, outcome.err)
