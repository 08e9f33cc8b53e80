"""Drive the fuzz targets: ``python -m fuzz.run [TARGET ...] [--seconds N] [--smoke]`` (``make fuzz``).

A run is bounded (``--seconds`` per target) and resumable: it starts from ``fuzz/corpus/<target>`` and, when it
ends, merges what it found back there, minimised (libFuzzer's ``-merge=1``: the smallest set of inputs with the
same coverage), and adds its executions to ``fuzz/progress.json``. An input that fails the target (an unexpected
exception or an oracle's ``AssertionError``) is kept as ``fuzz/findings/<target>-crash-<sha1>`` and the run
exits 1. ``--smoke`` works on a throwaway copy of the corpus and records nothing (``make test``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
FINDINGS = ROOT / "fuzz" / "findings"
PROGRESS = ROOT / "fuzz" / "progress.json"
_DONE = re.compile(rb"Done (\d+) runs in (\d+) second")


@dataclass(frozen=True)
class Outcome:
    target: str
    executions: int
    seconds: int
    failed: bool
    output: str


def _worker(name: str, *args: str | Path) -> list[str]:
    return [sys.executable, "-m", "fuzz.worker", name, *map(str, args)]


def fuzz_one(name: str, seconds: int, *, smoke: bool) -> Outcome:
    """Run one target for ``seconds`` from its corpus; outside a smoke run, merge the corpus back."""
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        work = Path(tmp) / "corpus"
        shutil.copytree(CORPUS / name, work) if (CORPUS / name).is_dir() else work.mkdir()
        findings = Path(tmp) if smoke else FINDINGS
        findings.mkdir(exist_ok=True)
        flags = [f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"]
        proc = subprocess.run(
            _worker(name, work, *flags, f"-artifact_prefix={findings}/{name}-"),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
        done = _DONE.search(proc.stdout)
        executions, elapsed = (int(done[1]), int(done[2])) if done else (0, 0)
        failed = proc.returncode != 0 or done is None
        if not smoke:
            _merge_back(name, work, Path(tmp) / "merged")
        tail = proc.stdout.decode(errors="replace").splitlines()[-60:]
        return Outcome(name, executions, elapsed, failed, "\n".join(tail))


def _merge_back(name: str, work: Path, merged: Path) -> None:
    """Replace the repository's corpus with the minimised union of it and what this run found."""
    merged.mkdir()
    proc = subprocess.run(_worker(name, "-merge=1", merged, work), cwd=ROOT, capture_output=True, check=False)
    if proc.returncode != 0 or not any(merged.iterdir()):
        merged = work  # keep everything rather than lose the run's findings
    target = CORPUS / name
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        old.unlink()
    for new in merged.iterdir():
        if new.is_file():
            shutil.copy2(new, target / new.name)


def record(outcome: Outcome) -> None:
    progress = json.loads(PROGRESS.read_text()) if PROGRESS.exists() else {}
    entry = progress.setdefault(outcome.target, {"executions": 0, "seconds": 0, "runs": 0})
    entry["executions"] += outcome.executions
    entry["seconds"] += outcome.seconds
    entry["runs"] += 1
    entry["corpus"] = len(list((CORPUS / outcome.target).iterdir()))
    PROGRESS.write_text(json.dumps(progress, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"default: all ({', '.join(TARGETS)})")
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "60")))
    parser.add_argument("--smoke", action="store_true", help="a throwaway corpus copy; nothing recorded")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    status = 0
    for name in args.targets or list(TARGETS):
        outcome = fuzz_one(name, args.seconds, smoke=args.smoke)
        if not args.smoke:
            record(outcome)
        verdict = "FAILED" if outcome.failed else "ok"
        print(f"{name}: {verdict}, {outcome.executions} executions in {outcome.seconds} s", flush=True)
        if outcome.failed:
            print(outcome.output, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
