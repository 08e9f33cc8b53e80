"""A daemon with one protection patched away, for the twin of a test that runs the daemons as processes.

``argv(protection)`` is the command line the twin starts a daemon with in place of ``python -m supervisor.cli``: a
separate program of the test suite that patches the one check in its own process, then runs the daemon's own
``main``. Nothing of the product reaches it: no flag, environment variable or file the daemons read names it (the
daemons re-execute themselves isolated when started with ``PYTHONPATH``, so not even a ``sitecustomize`` would
reach them), it is not part of the installed package, and the agent never chooses how a daemon is started. A
protection is off only in a process the test started as this program.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _fence_watch_blind() -> None:
    """The fence watch's comparison: every re-read reports the fingerprint ``confirm`` took."""
    from supervisor.boundary.capture.fence_watch import FenceWatch

    read = FenceWatch._read

    async def unchanged(self: FenceWatch) -> dict[str, Any] | None:
        report = await read(self)
        return None if report is None else {**report, "fingerprint": self.expected}

    FenceWatch._read = unchanged  # type: ignore[method-assign]


def _canary_probe_blind() -> None:
    """The boundary's reading of its own canary probe: a connect that succeeded reads as the fence's timeout
    (control's canary still counts the connection it accepted: that is control's check, not this one)."""
    from supervisor.boundary import fence
    from supervisor.boundary.capture.canary import ProbeResult
    from supervisor.protocol.fence_canary import PROBE_TIMEOUT_S

    probe = fence.probe_canary

    async def blind(number: int, address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
        result = await probe(number, address, port, timeout_s)
        if not result.connected:
            return result
        return ProbeResult(result.probe, result.target, False, f"timeout after {timeout_s:g}s")

    fence.probe_canary = blind  # type: ignore[assignment]


def _canary_local_failure_conclusive() -> None:
    """The canary probe's rule 2: a connect that failed for a local reason (``EADDRNOTAVAIL``: no source port
    left) counts as failed at a fence, as before the rule."""
    from supervisor.boundary.capture import canary

    setattr(canary, "FENCE_ERRNOS", canary.FENCE_ERRNOS | {errno.EADDRNOTAVAIL})  # noqa: B010 (a Final name)


def _exec_log_forgets_children() -> None:
    """The parent's image at a child's creation: the exec log never notes it, so a child forked before its
    parent execs an allowed binary is taken for that binary's descendant."""
    from supervisor.boundary.capture.connect_record import ExecLog

    def nothing(self: ExecLog, pid: int, start_time: int, parent_exe: str) -> None:
        return None

    ExecLog.note_child = nothing  # type: ignore[method-assign]


def _workload_oom_score_unset() -> None:
    """The workload's ``oom_score_adj`` of 1000: never written (the launcher's own score still is)."""
    from supervisor.boundary import daemon

    write = daemon.set_oom_score_adj

    def launcher_only(pid: int, value: int, *, proc: Path = Path("/proc")) -> None:
        if value != daemon.WORKLOAD_OOM_SCORE_ADJ:
            write(pid, value, proc=proc)

    daemon.set_oom_score_adj = launcher_only


def _memory_limit_lifted() -> None:
    """The workload's memory limit: its cgroup is made as asked, then the limit is lifted (what the boundary
    reports is still the limit it asked for)."""
    from supervisor.boundary import daemon
    from supervisor.boundary.process.memory_cgroup import MemoryCgroup

    create = daemon.create_memory_cgroup

    def unlimited(name: str, limit: int, **kw: Any) -> MemoryCgroup:
        group = create(name, limit, **kw)
        # v1: memory plus swap first, since it may never be below the memory limit
        names = ("memory.max",) if group.version == 2 else ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
        for file in names:
            if (group.directory / file).exists():
                (group.directory / file).write_text("max\n" if group.version == 2 else "-1\n")
        return group

    daemon.create_memory_cgroup = unlimited


PATCHES: dict[str, Callable[[], None]] = {
    "fence-watch": _fence_watch_blind,
    "canary-probe": _canary_probe_blind,
    "canary-local-failure": _canary_local_failure_conclusive,
    "exec-log-child": _exec_log_forgets_children,
    "workload-oom-score": _workload_oom_score_unset,
    "memory-limit": _memory_limit_lifted,
}


def argv(protection: str) -> list[str]:
    """The daemon's command (before its own arguments) with ``protection`` off."""
    assert protection in PATCHES, protection
    boot = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.controls_daemon import main; main()"
    return [sys.executable, "-c", boot, protection]


def main() -> None:
    protection, args = sys.argv[1], sys.argv[2:]
    PATCHES[protection]()
    from supervisor.cli.main import main as daemon_main

    sys.argv = ["openshell-sandbox", *args]
    sys.exit(daemon_main(args))
