"""The client driver: its copy runs anywhere, it answers like bench.clients, and a stuck one is noticed."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import remote
from bench.harness import Upstream
from bench.remote import ClientDriver, DriverError, client_copy, driver_argv, spawn_local
from bench.wire import Direction


@pytest.fixture(scope="module")
def copy() -> Iterator[Path]:
    root = client_copy()
    yield root
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


@pytest.fixture
def driver(copy: Path) -> Iterator[ClientDriver]:
    running = spawn_local(copy)
    yield running
    running.close()


def test_copy_is_world_readable_and_self_contained(copy: Path) -> None:
    for path in [copy, copy / "bench", *(copy / "bench").iterdir()]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & (0o555 if path.is_dir() else 0o444) == (0o555 if path.is_dir() else 0o444), path
    assert sorted(p.name for p in (copy / "bench").iterdir()) == sorted(remote.COPIED)


def test_copy_runs_under_another_uid(copy: Path) -> None:
    if os.geteuid() != 0 or not remote.SYSTEM_PYTHON.exists():
        pytest.skip("needs root and /usr/bin/python3 to run the driver as uid 1000")
    proc = subprocess.Popen(driver_argv(copy), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
                            user=1000, group=1000, extra_groups=[])  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    running = ClientDriver(proc.stdin, proc.stdout, proc)
    try:
        assert running.facts["uid"] == 1000 and running.facts["executable"] == str(remote.SYSTEM_PYTHON)
    finally:
        running.close()
    assert proc.returncode == 0


def test_every_operation_answers_like_the_client(driver: ClientDriver, upstream: Upstream) -> None:
    for direction in Direction:
        assert driver.bulk(None, upstream.bulk, direction, 2 * 1024 * 1024 + 5, timeout=10).size == 2 * 1024 * 1024 + 5
    sequential = driver.setup_sequential(None, upstream.echo, 20, timeout=10, budget=30)
    assert len(sequential.latencies) == 20 and sequential.errors == 0
    concurrent = driver.setup_concurrent(None, upstream.echo, 40, 8, timeout=10, budget=30)
    assert len(concurrent.latencies) == 40 and concurrent.errors == 0
    hold = driver.open_idle(None, upstream.idle, 30, 8, timeout=10, budget=30)
    assert (hold.opened, hold.errors) == (30, 0)
    assert driver.call("idle_close", {}, deadline=5) == {"closed": 30}
    assert driver.call("idle_close", {}, deadline=5) == {"closed": 0}


def test_a_failed_request_is_an_error_not_the_end(driver: ClientDriver, upstream: Upstream) -> None:
    with pytest.raises(DriverError, match="ConnectionRefusedError"):
        driver.bulk(("127.0.0.1", 1), upstream.bulk, Direction.UP, 10, timeout=5)
    with pytest.raises(DriverError, match="unknown op"):
        driver.call("format_disk", {}, deadline=5)
    assert driver.broken is None
    assert len(driver.setup_sequential(None, upstream.echo, 2, timeout=10, budget=10).latencies) == 2


def test_a_dead_driver_is_broken(driver: ClientDriver, upstream: Upstream) -> None:
    assert driver.proc is not None
    driver.proc.kill()
    driver.proc.wait()
    with pytest.raises(DriverError):
        driver.setup_sequential(None, upstream.echo, 1, timeout=5, budget=5)
    assert driver.broken
    with pytest.raises(DriverError):
        driver.setup_sequential(None, upstream.echo, 1, timeout=5, budget=5)


def test_a_silent_driver_is_broken_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "SLACK", 0.2)
    code = "import sys, time; print('{\"ready\": true}', flush=True); sys.stdin.readline(); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    silent = ClientDriver(proc.stdin, proc.stdout, proc)
    try:
        with pytest.raises(DriverError, match="no answer"):
            silent.setup_sequential(None, ("127.0.0.1", 9), 1, timeout=0.1, budget=0.1)
        assert silent.broken
    finally:
        silent.close(timeout=0.5)
    assert proc.poll() is not None
