"""The harness's command line and one small end-to-end run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench import interpreter
from bench.harness import main, make_config, parse_args, product_snapshot
from bench.remote import SYSTEM_PYTHON
from bench.scenarios import idle_sizes
from tests.netns_hosts import unavailable_reason


def test_direct_is_always_measured_and_order_kept() -> None:
    assert parse_args(["--contenders", "squid,tinyproxy"]).contender_names == ["direct", "squid", "tinyproxy"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--contenders", "nginx"],
        ["--runs", "0"],
        ["--contenders", "direct", "--profile", "squid"],
        ["--idle-budget", "0"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize(
    ("wanted", "nofile", "sizes"),
    [((1000, 10000), 65536, (1000, 10000)), ((1000, 10000), 20000, (1000, 9872)), ((1000,), 1024, (384,))],
)
def test_idle_sizes_fit_two_descriptors_per_connection(
    wanted: tuple[int, ...], nofile: int, sizes: tuple[int, ...]
) -> None:
    got, notes = idle_sizes(wanted, nofile)
    assert got == sizes
    assert len(notes) == sum(1 for w, s in zip(wanted, sizes, strict=True) if w != s)


def test_default_and_quick_configs() -> None:
    full, _ = make_config(quick=False, runs=5, nofile=65536)
    quick, _ = make_config(quick=True, runs=5, nofile=65536)
    assert full.bulk_bytes == 1 << 30 and full.idle_sizes == (1000, 10000) and full.concurrency == 64
    assert quick.bulk_bytes == 128 << 20 and quick.idle_sizes == (1000,)


def test_product_snapshot_is_a_copy_with_its_commit(tmp_path: Path) -> None:
    root, facts = product_snapshot(tmp_path)
    checkout = Path(__file__).parents[2] / "supervisor"
    assert (root / "supervisor" / "cli" / "main.py").read_bytes() == (checkout / "cli" / "main.py").read_bytes()
    assert facts["commit"]
    assert not list(root.rglob("__pycache__"))
    assert isinstance(facts["uncommitted"], list)
    assert all(path.startswith("supervisor/") for path in facts["uncommitted"])  # whole paths, none clipped


def test_one_small_run_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--quick",
            "--runs",
            "1",
            "--contenders",
            "direct,openshell",
            "--no-micro",
            "--no-install",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "summary" in out
    [result] = list(tmp_path.glob("bench-*.json"))
    document = json.loads(result.read_text())
    rows = {(r["scenario"], r["metric"], r["contender"]): r for r in document["rows"]}
    bulk = rows[("bulk up", "MB/s", "direct")]
    assert bulk["summary"]["n"] == 1 and bulk["summary"]["median"] > 0
    assert document["clients"]["harness client"]["ready"]
    if unavailable_reason() or not SYSTEM_PYTHON.exists():
        # Without a namespace for the upstream the sandbox cannot be measured: skipped, with the reason.
        assert "openshell" in document["skipped"] and "skipped: " in out
        return
    # The full path was measured, by the driver that is the sandbox's agent, against the upstream host.
    assert document["skipped"] == {} and document["failures"] == []
    assert document["clients"]["openshell client"]["uid"] != 0
    assert not document["upstream"]["echo"][0].startswith("127.")
    for scenario, metric in (("bulk down", "MB/s"), ("setup 64-way", "conns/s"), ("idle 1000", "control peak")):
        assert rows[(scenario, metric, "openshell")]["summary"]["median"] > 0
    assert rows[("idle 1000", "control peak", "direct")]["summary"] is None
    assert list(tmp_path.glob("bench-*.md"))
    # the daemons ran on the interpreter the table and the JSON name (by default the venv of Debian's python3)
    daemons = document["product"]["daemon_python"]
    assert daemons["path"] == interpreter.default_daemon_python() and daemons["version"]
    assert f"openshell daemons on: {interpreter.label(daemons)}" in out


def test_daemon_python_is_described_and_a_bad_one_refused(tmp_path: Path) -> None:
    facts = interpreter.describe(sys.executable)
    assert facts["path"] == sys.executable and facts["real_path"] == os.path.realpath(sys.executable)
    assert str(facts["version"]) in interpreter.label(facts)
    with pytest.raises(interpreter.InterpreterError, match="not an executable"):
        interpreter.describe(str(tmp_path / "python9"))
    bare = tmp_path / "bare"
    bare.write_text('#!/bin/sh\necho \'{"missing": ["trio (ModuleNotFoundError)"]}\'\n')
    bare.chmod(0o755)
    with pytest.raises(interpreter.InterpreterError, match="cannot import the daemons' trio"):
        interpreter.describe(str(bare))


def test_daemon_python_defaults_to_the_venv_and_can_be_named() -> None:
    assert parse_args([]).daemon_python == interpreter.default_daemon_python()
    assert parse_args(["--daemon-python", "/opt/py/bin/python3"]).daemon_python == "/opt/py/bin/python3"
