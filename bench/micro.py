"""Running the project's micro-benchmarks (policy decision, exec round trip, TLS handshake, connect identity)
as extra rows.

The contract with those scripts (``bench/bench_policy.py``, ``bench/bench_exec.py``, ``bench/bench_event_format.py``,
``bench/bench_handshake.py``), each run as ``python3 bench/bench_X.py --json [--quick]``:

* ``--quick`` is passed in quick mode only when the script's ``--help`` mentions it;
* every line of stdout that is a JSON object is one row; other lines are ignored;
* a row has ``name`` (str) and ``unit`` (str), and a headline number in ``value`` (or, failing that,
  ``p50`` or ``median``); optional: ``p50``, ``p99``, ``min``, ``max``, ``runs`` (int), ``target``
  (same unit; lower is better), ``note`` (str);
* also accepted, the flat shape ``{"bench": B, "<what>_p50_ms": .., "<what>_p99_ms": .., "<what>_runs" or
  "runs": ..}`` (``bench_exec_e2e.py``'s): one ``ms`` row per ``<what>``, named ``B <what>``;
* exit status 0; a script that fails, times out or prints no valid row is reported with its reason;
* it runs with the repository as working directory and on ``PYTHONPATH`` (``import bench.x`` works).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = ("bench_policy.py", "bench_exec.py", "bench_exec_e2e.py", "bench_exec_cpu.py", "bench_handshake.py",
           "bench_l7.py", "bench_connect_identity.py", "bench_link.py", "bench_event_format.py")  # fmt: skip
NUMBER_FIELDS = ("p50", "p99", "min", "max", "target")


@dataclass(frozen=True)
class MicroRow:
    script: str
    name: str
    unit: str
    value: float
    extra: dict[str, float]
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "script": self.script,
            "name": self.name,
            "unit": self.unit,
            "value": self.value,
            **self.extra,
            "note": self.note,
        }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_rows(script: str, stdout: str) -> tuple[list[MicroRow], list[str]]:
    """Rows from a script's stdout, and a problem per JSON line that is not a valid row."""
    rows: list[MicroRow] = []
    problems: list[str] = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"not JSON ({exc.msg}): {line[:80]}")
            continue
        if "name" not in obj and isinstance(obj.get("bench"), str):
            flat = _flat_rows(script, obj)
            if flat:
                rows.extend(flat)
                continue
        name, unit = obj.get("name"), obj.get("unit")
        value = next((v for k in ("value", "p50", "median") if (v := _number(obj.get(k))) is not None), None)
        if not isinstance(name, str) or not isinstance(unit, str) or value is None:
            problems.append(f"row needs name, unit and value: {line[:80]}")
            continue
        extra = {k: n for k in NUMBER_FIELDS if (n := _number(obj.get(k))) is not None}
        if (runs := _number(obj.get("runs"))) is not None:
            extra["runs"] = runs
        note = obj.get("note")
        rows.append(MicroRow(script, name, unit, value, extra, note if isinstance(note, str) else ""))
    return rows, problems


def _flat_rows(script: str, obj: dict[str, object]) -> list[MicroRow]:
    rows: list[MicroRow] = []
    for key, raw in obj.items():
        if not key.endswith("_p50_ms") or (p50 := _number(raw)) is None:
            continue
        what = key.removesuffix("_p50_ms")
        extra = {"p50": p50}
        if (p99 := _number(obj.get(f"{what}_p99_ms"))) is not None:
            extra["p99"] = p99
        if (runs := _number(obj.get(f"{what}_runs", obj.get("runs")))) is not None:
            extra["runs"] = runs
        rows.append(MicroRow(script, f"{obj['bench']} {what}", "ms", p50, extra))
    return rows


def run_script(path: Path, quick: bool, timeout: float) -> tuple[list[MicroRow], str | None]:
    """Run one micro-benchmark; return its rows and, if it failed, the reason."""
    argv = [sys.executable, str(path), "--json"]
    repo = path.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    try:
        if quick:
            helptext = subprocess.run(
                [*argv[:2], "--help"], capture_output=True, text=True, timeout=60, cwd=repo, env=env
            ).stdout
            if "--quick" in helptext:
                argv.append("--quick")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=repo, env=env)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s"
    rows, problems = parse_rows(path.name, done.stdout)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return rows, f"exited {done.returncode}: {tail[0][:160]}"
    if not rows:
        return [], "printed no row" + (f" ({problems[0]})" if problems else "")
    return rows, None


def run_all(bench_dir: Path, quick: bool, timeout: float) -> tuple[list[MicroRow], dict[str, str]]:
    """Every micro-benchmark present: all rows, and {script: reason} for those absent or failed."""
    rows: list[MicroRow] = []
    skipped: dict[str, str] = {}
    for name in SCRIPTS:
        path = bench_dir / name
        if not path.exists():
            skipped[name] = "not written yet"
            continue
        print(f"bench: running {name}", file=sys.stderr, flush=True)
        got, reason = run_script(path, quick, timeout)
        rows.extend(got)
        if reason:
            skipped[name] = reason
    return rows, skipped


MICRO_HEADER = ["script", "benchmark", "value", "unit", "p50", "p99", "target", "runs"]


def micro_grid(rows: list[MicroRow]) -> list[list[str]]:
    def number(row: MicroRow, key: str) -> str:
        value = row.extra.get(key)
        return "" if value is None else f"{value:.4g}"

    return [MICRO_HEADER] + [
        [
            r.script,
            r.name,
            f"{r.value:.4g}",
            r.unit,
            number(r, "p50"),
            number(r, "p99"),
            number(r, "target"),
            number(r, "runs"),
        ]
        for r in rows
    ]
