"""Parsing the micro-benchmarks' JSON lines, and running a script end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_exec_cpu import rows
from bench.micro import MicroRow, parse_rows, run_all, run_script


@pytest.mark.parametrize(
    ("line", "value", "extra"),
    [
        ('{"name": "decision, 10 rules", "unit": "us", "value": 1.5}', 1.5, {}),
        (
            '{"name": "exec true", "unit": "ms", "p50": 4, "p99": 9, "runs": 200, "target": 5}',
            4.0,
            {"p50": 4.0, "p99": 9.0, "runs": 200.0, "target": 5.0},
        ),
        ('{"name": "x", "unit": "ms", "median": 2.5, "min": 1}', 2.5, {"min": 1.0}),
    ],
)
def test_valid_rows(line: str, value: float, extra: dict[str, float]) -> None:
    rows, problems = parse_rows("bench_x.py", "warming up\n" + line + "\n")
    assert problems == []
    assert rows == [MicroRow("bench_x.py", json.loads(line)["name"], json.loads(line)["unit"], value, extra)]


def test_flat_shape_gives_one_row_per_measurement() -> None:
    line = (
        '{"bench": "exec_e2e", "api_p50_ms": 10.3, "api_p99_ms": 13.5, "cli_p50_ms": 285.0, '
        '"cli_p99_ms": 328.6, "runs": 300, "cli_runs": 20}'
    )
    rows, problems = parse_rows("bench_exec_e2e.py", line)
    assert problems == []
    assert rows == [
        MicroRow("bench_exec_e2e.py", "exec_e2e api", "ms", 10.3, {"p50": 10.3, "p99": 13.5, "runs": 300.0}),
        MicroRow("bench_exec_e2e.py", "exec_e2e cli", "ms", 285.0, {"p50": 285.0, "p99": 328.6, "runs": 20.0}),
    ]


@pytest.mark.parametrize(
    "line",
    [
        '{"bench": "x", "note": "no numbers"}',
        '{"unit": "us", "value": 1}',
        '{"name": "x", "value": 1}',
        '{"name": "x", "unit": "us", "value": true}',
        '{"name": "x", "unit": "us", "value": "fast"}',
        '{"name": "x", "unit": "us"',
    ],
)
def test_invalid_rows_are_problems_not_rows(line: str) -> None:
    rows, problems = parse_rows("bench_x.py", line)
    assert rows == [] and len(problems) == 1


def _script(tmp_path: Path, body: str) -> Path:
    bench = tmp_path / "bench"
    bench.mkdir(exist_ok=True)
    path = bench / "bench_policy.py"
    path.write_text(body)
    return path


def test_run_script_passes_quick_only_when_offered(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        (
            "import argparse, json\n"
            "p = argparse.ArgumentParser(); p.add_argument('--json', action='store_true')\n"
            "p.add_argument('--quick', action='store_true'); a = p.parse_args()\n"
            "print(json.dumps({'name': 'quick' if a.quick else 'full', 'unit': 'us', 'value': 1}))\n"
        ),
    )
    rows, reason = run_script(path, quick=True, timeout=60)
    assert reason is None and [r.name for r in rows] == ["quick"]


def test_run_script_reports_failure(tmp_path: Path) -> None:
    path = _script(tmp_path, 'import sys\nprint(\'{"name": "a", "unit": "us", "value": 1}\')\nsys.exit(3)\n')
    rows, reason = run_script(path, quick=False, timeout=60)
    assert reason is not None and reason.startswith("exited 3")
    assert len(rows) == 1


def test_run_all_names_missing_scripts(tmp_path: Path) -> None:
    _script(tmp_path, "print('no json here')\n")
    rows, skipped = run_all(tmp_path / "bench", quick=False, timeout=60)
    assert rows == []
    assert skipped == {
        "bench_policy.py": "printed no row",
        "bench_exec.py": "not written yet",
        "bench_exec_e2e.py": "not written yet",
        "bench_exec_cpu.py": "not written yet",
        "bench_handshake.py": "not written yet",
        "bench_l7.py": "not written yet",
        "bench_connect_identity.py": "not written yet",
        "bench_link.py": "not written yet",
        "bench_event_format.py": "not written yet",
    }


def test_exec_cpu_rows_follow_the_contract() -> None:
    """bench_exec_cpu's --json rows parse as micro rows, one per figure, with the values it measured."""
    result = {
        "bench": "exec_cpu", "runs": 7, "load": [0.1, 0.2], "api_p50_ms": 5.5,
        "sandbox_cpu_ms_per_exec": {"boundary": 2.8, "control": 2.1, "dev": 0.0, "init_and_below": 1.9, "total": 6.8},
        "client_cpu_ms_per_exec": 0.7,
    }  # fmt: skip
    parsed, problems = parse_rows("bench_exec_cpu.py", "\n".join(json.dumps(row) for row in rows(result)))
    assert problems == []
    assert {row.name.split(": ", 1)[1]: row.value for row in parsed} == {
        "sandbox CPU per exec": 6.8, "control CPU per exec": 2.1, "boundary CPU per exec": 2.8,
        "init_and_below CPU per exec": 1.9, "client CPU per exec": 0.7, "p50 of the CPU loop": 5.5,
    }  # fmt: skip
    assert all(row.unit == "ms" and row.extra.get("runs") == 7 for row in parsed)
