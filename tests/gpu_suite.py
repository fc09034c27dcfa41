"""The GPU half of the suite in one ~7-minute call instead of ~10: each GPU test file in its own
pytest process, the files that share the GPUs run side by side, longest first by an earlier run's
seconds (``tests/gpu_suite_durations.json``; each run writes its own to ``--logs``/durations.json)
(tiny models; every rank set picks its own free port), then the ``gpu_alone`` files (they start the
MPS daemon, which every CUDA process on the machine would join) one at a time. Per-file logs go to
``--logs``; the table names every file's outcome and seconds; the exit status is 1 if any file
failed or ran out of time.

    python tests/gpu_suite.py --logs $OUT/suite            # every file (``make test-gpu-parallel``)
    python tests/gpu_suite.py --logs /tmp/s tests/executor/test_exec_nccl4.py   # some files
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"=+ (.*) in [\d.]+s")
MARK = re.compile(r"(?<![\"'])pytest\.mark\.gpu\b")  # a module, test or parameter marked gpu (not in quotes)
ALONE = re.compile(r"pytest\.mark\.gpu_alone\b")
DURATIONS = ROOT / "tests" / "gpu_suite_durations.json"  # the last whole run's seconds per file (see its "run")


def gpu_files(paths: list[str]) -> list[Path]:
    roots = [ROOT / p for p in paths] if paths else [ROOT / "tests"]
    files: list[Path] = []
    for r in roots:
        for f in sorted([r] if r.is_file() else r.rglob("test_*.py")):
            if MARK.search(f.read_text()):
                files.append(f)
    return files


def alone(f: Path) -> bool:
    return bool(ALONE.search(f.read_text()))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def shards(f: Path, per_shard: int) -> list[tuple[str, list[str]]]:
    """``f`` as (name, node ids) pieces of at most ``per_shard`` tests each, so a long file (the
    4-rank oracle, ~70 plans) runs as several pytest processes side by side, each with its own rank
    pool, instead of one process past the per-file limit. One piece, all of ``f``, when it is short
    or nothing could be collected (the run then reports the file's own error)."""
    name = str(f.relative_to(ROOT))
    if per_shard <= 0:
        return [(name, [name])]
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p",
                          "no:cacheprovider", name], cwd=ROOT, capture_output=True, text=True, env=_env())
    ids = [ln for ln in out.stdout.splitlines() if ln.startswith(name + "::")]
    if len(ids) <= per_shard:
        return [(name, [name])]
    k = -(-len(ids) // per_shard)
    return [(f"{name}[{i + 1}/{k}]", ids[i::k]) for i in range(k)]


def load_seconds(path: Path) -> dict[str, float]:
    """Seconds per file or shard of an earlier run (``{"seconds": {name: s}}``, as :func:`main` writes
    to ``--logs``/durations.json); none where the file is missing."""
    return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()} if path.exists() else {}


def longest_first(pieces: list[tuple[str, list[str]]], seconds: dict[str, float]) -> list[tuple[str, list[str]]]:
    """``pieces`` in the order that ends the side-by-side run soonest: the longest first (a long file
    started last is the run's long pole: on 4x H100, 2026-11-27, the train jobs started after 16 shorter
    files and were cut at the part's 570 s), a piece with no earlier time before all (it may be long).
    A shard without its own time takes its file's."""
    def took(name: str) -> float:
        return seconds.get(name, seconds.get(name.split("[")[0], float("inf")))
    return sorted(pieces, key=lambda p: took(p[0]), reverse=True)


def run_file(piece: tuple[str, list[str]], logs: Path, timeout: float) -> tuple[str, str, float]:
    name, targets = piece
    log = logs / (re.sub(r"[/\[\]]", "_", name) + ".log")
    t0 = time.monotonic()
    with log.open("w") as out:
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
                                 *targets], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=_env(),
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    dt = time.monotonic() - t0
    found = SUMMARY.findall(log.read_text())
    outcome = found[-1] if found else "no summary"
    if rc == -1:
        outcome = f"TIMED OUT after {timeout:.0f} s ({outcome})"
    elif rc not in (0, 5):  # 5: nothing collected (e.g. skipped by marker)
        outcome = f"FAILED rc={rc}: {outcome}"
    return name, outcome, dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="test files or folders (default: tests/)")
    ap.add_argument("--logs", default="gpu-suite-logs", help="folder for per-file logs")
    ap.add_argument("--jobs", type=int, default=6, help="files run side by side")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per file")
    ap.add_argument("--per-shard", type=int, default=24,
                    help="tests per pytest process for a long file (0: one process per file)")
    ap.add_argument("--part", choices=("all", "shared", "alone"), default="all",
                    help="only the files that share the GPUs, or only the gpu_alone ones (two calls)")
    ap.add_argument("--durations", default=str(DURATIONS),
                    help="an earlier run's seconds per file (its --logs/durations.json): the longest start first")
    a = ap.parse_args(argv)
    logs = Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    files = gpu_files(a.paths)
    shared = [f for f in files if not alone(f)] if a.part != "alone" else []
    solo = [f for f in files if alone(f)] if a.part != "shared" else []
    t0 = time.monotonic()
    pieces = [p for f in shared for p in shards(f, a.per_shard)]
    pieces = longest_first(pieces, load_seconds(Path(a.durations)))

    def done(result: tuple[str, str, float]) -> tuple[str, str, float]:
        name, outcome, dt = result  # each file's line as it ends: a call cut short still reports those
        print(f"{name}  {dt:.0f} s  {outcome}", flush=True)
        return result

    results: list[tuple[str, str, float]] = []
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for fut in as_completed([pool.submit(run_file, p, logs, a.timeout) for p in pieces]):
            results.append(done(fut.result()))
    results += [done(run_file(p, logs, a.timeout)) for f in solo for p in shards(f, 0)]
    width = max((len(n) for n, _, _ in results), default=10)
    print("---")
    for name, outcome, dt in sorted(results):
        print(f"{name:<{width}}  {dt:6.0f} s  {outcome}")
    (logs / "durations.json").write_text(json.dumps({"seconds": {n: round(dt) for n, _, dt in sorted(results)}},
                                                     indent=1) + "\n")
    bad = [n for n, o, _ in results if o.startswith(("FAILED", "TIMED OUT"))]
    tail = f": {', '.join(bad)}" if bad else ""
    print(f"{len(results)} files in {time.monotonic() - t0:.0f} s; {len(bad)} failed{tail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
