"""The launcher files what the zygote sends unprompted even when nothing is awaited from it (launcher.py
``_drain``): the init leases its next spare exec-init after the exit that made it due, and a spare the
boundary has not heard of counts as a workload process — every "all the workload's processes are gone" wait then
hangs on it (a process-table test failed so in a side-by-side run)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from supervisor.boundary.forkimage import wire
from supervisor.boundary.process.launcher import Launcher, LauncherError


@pytest.fixture
def spare() -> Iterator[int]:
    """A child of this process standing for the spare: this process plays the zygote whose descendants are
    the workload."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def launcher_pair() -> Iterator[tuple[Launcher, socket.socket]]:
    """A launcher whose zygote is this process, and the zygote's end of its socket (what the test sends)."""
    ours, theirs = wire.socket_pair()
    ours.setblocking(False)
    yield Launcher(ours, pid=os.getpid()), theirs
    ours.close()
    theirs.close()


def _lease(spare: int) -> tuple[dict[str, object], list[int]]:
    """A lease message for ``spare`` (zygote.py "Spares") and its fds: command socket, pidfd, report."""
    ours, _theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    report_r, report_w = os.pipe()
    os.close(report_w)
    confinement = {"uid": 1000, "gid": 1000, "groups": [], "landlock": None, "seccomp": True, "notify": False}
    message = {"spare": spare, "ns_pid": 1, "confinement": confinement, "notes": []}
    return message, [ours.detach(), os.pidfd_open(spare), report_r]


def test_a_spare_leased_while_nobody_waits_is_left_out_of_the_workload(
    spare: int, launcher_pair: tuple[Launcher, socket.socket]
) -> None:
    launcher, theirs = launcher_pair
    assert spare in launcher.workload_pids()  # not leased: a process like any other
    message, fds = _lease(spare)
    wire.send(theirs, message, fds)  # no request pending, no exit awaited: nobody pumps the socket
    wire.close_all(fds)
    assert spare not in launcher.workload_pids()
    assert [lease.pid for lease in launcher._leases] == [spare]
    launcher.close()  # the lease is let go with the launcher
    assert not launcher._leases


def test_a_lease_with_the_wrong_fds_is_refused(spare: int, launcher_pair: tuple[Launcher, socket.socket]) -> None:
    """Under the connect-notify filter a lease must bring its listener; without a notifier it is not taken."""
    launcher, theirs = launcher_pair
    message, fds = _lease(spare)
    message["confinement"] = {**message["confinement"], "notify": True}  # type: ignore[dict-item]
    wire.send(theirs, message, fds)
    wire.close_all(fds)
    assert spare in launcher.workload_pids()  # no lease filed: still counted
    assert not launcher._leases


def test_an_eof_while_nobody_waits_marks_the_launcher_dead(launcher_pair: tuple[Launcher, socket.socket]) -> None:
    launcher, theirs = launcher_pair
    theirs.close()
    launcher.workload_pids()
    with pytest.raises(LauncherError, match="launcher exited"):
        launcher._check_alive()
