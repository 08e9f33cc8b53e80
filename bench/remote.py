"""The harness's side of the client driver (``bench/driver.py``): a copy any uid can run, and its proxy object.

:func:`client_copy` writes ``bench/{__init__,clients,wire,driver}.py`` into a fresh 0755 directory, so that
Debian's ``/usr/bin/python3`` can run them as any uid (the harness's own interpreter may live under a
0700 home). :class:`ClientDriver` speaks the driver's line protocol over a child's stdin/stdout and returns
the same result types as :mod:`bench.clients`, so the scenarios do not care where the client runs.

A request that gets no answer within its deadline (the budget the request itself carries, plus slack) marks
the driver broken: every later request fails at once, and the harness starts a new one.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.clients import BulkResult, SetupResult
from bench.wire import Direction

Address = tuple[str, int]
BENCH_DIR = Path(__file__).resolve().parent
COPIED = ("__init__.py", "clients.py", "wire.py", "driver.py", "tls_clients.py")
SYSTEM_PYTHON = Path("/usr/bin/python3")
READY_TIMEOUT = 60.0
SLACK = 60.0  # seconds beyond a request's own budget before the driver counts as stuck


class DriverError(Exception):
    """The driver answered with an error, died, or did not answer in time."""


def driver_python() -> str:
    """The interpreter every driver runs under: Debian's where it exists (any uid can read it)."""
    return str(SYSTEM_PYTHON) if SYSTEM_PYTHON.exists() else sys.executable


def client_copy() -> Path:
    """A fresh 0755 directory holding the driver and the client modules; the caller removes it."""
    root = Path(tempfile.mkdtemp(prefix="openshell-bench-client-", dir="/tmp"))
    (root / "bench").mkdir()
    for name in COPIED:
        shutil.copyfile(BENCH_DIR / name, root / "bench" / name)
        (root / "bench" / name).chmod(0o644)
    (root / "bench").chmod(0o755)
    root.chmod(0o755)
    return root


def driver_argv(copy: Path) -> list[str]:
    # -I: no PYTHON* variables, no user site, no script directory on sys.path; -B: no .pyc beside the copy.
    return [driver_python(), "-I", "-B", str(copy / "bench" / "driver.py")]


@dataclass
class RemoteIdle:
    """Idle connections held by a driver (the counterpart of ``clients.IdleHold``)."""

    opened: int
    errors: int
    seconds: float
    driver: ClientDriver
    error_kinds: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        self.driver.call("idle_close", {}, deadline=SLACK)


class ClientDriver:
    """One running driver, reached through ``stdin``/``stdout`` (the pipes of a child process)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], proc: subprocess.Popen[bytes] | None = None) -> None:
        self.stdin = stdin
        self.proc = proc  # ended by close() when the harness started it itself
        self.broken: str | None = None
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, args=(stdout,), daemon=True).start()
        self.facts: dict[str, Any] = self._next(READY_TIMEOUT, "start")
        if not self.facts.get("ready"):
            self.broken = f"driver did not say ready: {self.facts}"
            raise DriverError(self.broken)

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self._lines.put(line)
        self._lines.put(b"")  # EOF

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=deadline)
        except queue.Empty:
            self.broken = f"no answer to {what} within {deadline:.0f} s"
            raise DriverError(self.broken) from None
        if not line:
            self.broken = f"the driver ended (during {what})"
            raise DriverError(self.broken)
        try:
            message: dict[str, Any] = json.loads(line)
        except ValueError:
            self.broken = f"the driver wrote {line[:200]!r}"
            raise DriverError(self.broken) from None
        return message

    def call(self, op: str, args: dict[str, Any], deadline: float) -> dict[str, Any]:
        if self.broken:
            raise DriverError(self.broken)
        try:
            self.stdin.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
            self.stdin.flush()
        except OSError as exc:
            self.broken = f"the driver's stdin is gone: {exc}"
            raise DriverError(self.broken) from None
        reply = self._next(deadline + SLACK, op)
        if not reply.get("ok"):
            raise DriverError(str(reply.get("error")))
        result: dict[str, Any] = reply["result"]
        return result

    # -- the client calls, with bench.clients' signatures and result types -----------------------------------
    def bulk(self, proxy: Address | None, target: Address, direction: Direction, size: int,
             timeout: float) -> BulkResult:  # fmt: skip
        args = {"proxy": proxy, "target": target, "direction": direction.value, "size": size, "timeout": timeout}
        result = self.call("bulk", args, deadline=max(600.0, size / 10e6))  # a floor of 10 MB/s
        return BulkResult(int(result["size"]), float(result["seconds"]))

    def setup_sequential(self, proxy: Address | None, target: Address, count: int, timeout: float,
                         budget: float) -> SetupResult:  # fmt: skip
        args = {"proxy": proxy, "target": target, "count": count, "timeout": timeout, "budget": budget}
        return self._setup(self.call("setup_sequential", args, deadline=budget + timeout))

    def setup_concurrent(self, proxy: Address | None, target: Address, count: int, concurrency: int,
                         timeout: float, budget: float) -> SetupResult:  # fmt: skip
        args = {"proxy": proxy, "target": target, "count": count, "concurrency": concurrency, "timeout": timeout,
                "budget": budget}  # fmt: skip
        return self._setup(self.call("setup_concurrent", args, deadline=budget + timeout))

    @staticmethod
    def _setup(result: dict[str, Any]) -> SetupResult:
        steps = {str(step): [float(x) for x in values] for step, values in result.get("steps", {}).items()}
        return SetupResult([float(x) for x in result["latencies"]], int(result["errors"]), float(result["seconds"]),
                           _kinds(result), steps)  # fmt: skip

    def https_setup_sequential(self, proxy: Address | None, target: Address, cafile: str | None, count: int,
                               timeout: float, budget: float) -> SetupResult:  # fmt: skip
        args = {"proxy": proxy, "target": target, "cafile": cafile, "count": count, "timeout": timeout,
                "budget": budget}  # fmt: skip
        return self._setup(self.call("https_setup_sequential", args, deadline=budget + timeout))

    def https_download(self, proxy: Address | None, target: Address, cafile: str | None, size: int,
                       timeout: float) -> BulkResult:  # fmt: skip
        args = {"proxy": proxy, "target": target, "cafile": cafile, "size": size, "timeout": timeout}
        result = self.call("https_download", args, deadline=max(600.0, size / 10e6))
        return BulkResult(int(result["size"]), float(result["seconds"]))

    def open_idle(self, proxy: Address | None, target: Address, count: int, concurrency: int, timeout: float,
                  budget: float) -> RemoteIdle:  # fmt: skip
        args = {"proxy": proxy, "target": target, "count": count, "concurrency": concurrency, "timeout": timeout,
                "budget": budget}  # fmt: skip
        result = self.call("idle_open", args, deadline=budget + timeout)
        return RemoteIdle(int(result["opened"]), int(result["errors"]), float(result["seconds"]), self,
                          _kinds(result))  # fmt: skip

    def close(self, timeout: float = 10.0) -> None:
        """Close the driver's stdin (it exits); end it if the harness started it and it lingers."""
        self.broken = self.broken or "closed"
        try:
            self.stdin.close()
        except OSError:
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _kinds(result: dict[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in dict(result.get("error_kinds") or {}).items()}


def spawn_local(copy: Path) -> ClientDriver:
    """A driver in the harness's own namespace and uid: the client for direct and every peer proxy."""
    proc = subprocess.Popen(driver_argv(copy), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
    assert proc.stdin is not None and proc.stdout is not None
    try:
        return ClientDriver(proc.stdin, proc.stdout, proc)
    except DriverError:
        proc.kill()
        proc.wait()
        raise
