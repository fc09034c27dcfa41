"""The GPU half of the suite in one ~7-minute call instead of ~10: each GPU test file in its own
pytest process, the files that share the GPUs run side by side (tiny models; every rank set picks
its own free port), then the ``gpu_alone`` files (they start the MPS daemon, which every CUDA
process on the machine would join) one at a time. Per-file logs go to ``--logs``; the table names
every file's outcome and seconds; the exit status is 1 if any file failed or ran out of time.

    python tests/gpu_suite.py --logs $OUT/suite            # every file (``make test-gpu-parallel``)
    python tests/gpu_suite.py --logs /tmp/s tests/executor/test_exec_nccl4.py   # some files
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"=+ (.*) in [\d.]+s")
MARK = re.compile(r"(?<![\"'])pytest\.mark\.gpu\b")  # a module, test or parameter marked gpu (not in quotes)
ALONE = re.compile(r"pytest\.mark\.gpu_alone\b")


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


def run_file(f: Path, logs: Path, timeout: float) -> tuple[str, str, float]:
    name = str(f.relative_to(ROOT))
    log = logs / (name.replace("/", "_") + ".log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    with log.open("w") as out:
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", name],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
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
    ap.add_argument("--part", choices=("all", "shared", "alone"), default="all",
                    help="only the files that share the GPUs, or only the gpu_alone ones (two calls)")
    a = ap.parse_args(argv)
    logs = Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    files = gpu_files(a.paths)
    shared = [f for f in files if not alone(f)] if a.part != "alone" else []
    solo = [f for f in files if alone(f)] if a.part != "shared" else []
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        results = list(pool.map(lambda f: run_file(f, logs, a.timeout), shared))
    results += [run_file(f, logs, a.timeout) for f in solo]
    width = max((len(n) for n, _, _ in results), default=10)
    for name, outcome, dt in results:
        print(f"{name:<{width}}  {dt:6.0f} s  {outcome}")
    bad = [n for n, o, _ in results if o.startswith(("FAILED", "TIMED OUT"))]
    tail = f": {', '.join(bad)}" if bad else ""
    print(f"{len(results)} files in {time.monotonic() - t0:.0f} s; {len(bad)} failed{tail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
