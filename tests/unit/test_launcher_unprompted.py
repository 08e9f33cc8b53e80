"""The launcher files what the zygote sends unprompted even when nothing is awaited from it (launcher.py
``_drain``): the init announces its next spare exec-init after the exit that made it due, and a spare the
boundary has not heard of counts as a workload process — every "all the workload's processes are gone" wait then
hangs on it (a process-table test failed so in a side-by-side run)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from supervisor.boundary.process import zygote
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
    ours, theirs = zygote.socket_pair()
    ours.setblocking(False)
    yield Launcher(ours, pid=os.getpid()), theirs
    ours.close()
    theirs.close()


def test_a_spare_announced_while_nobody_waits_is_left_out_of_the_workload(
    spare: int, launcher_pair: tuple[Launcher, socket.socket]
) -> None:
    launcher, theirs = launcher_pair
    assert spare in launcher.workload_pids()  # not announced: a process like any other
    zygote.send(theirs, {"spare": spare})  # no request pending, no exit awaited: nobody pumps the socket
    assert spare not in launcher.workload_pids()
    zygote.send(theirs, {"spare": None})  # a nested spawn took it: it is the workload's again
    assert spare in launcher.workload_pids()


def test_an_eof_while_nobody_waits_marks_the_launcher_dead(launcher_pair: tuple[Launcher, socket.socket]) -> None:
    launcher, theirs = launcher_pair
    theirs.close()
    launcher.workload_pids()
    with pytest.raises(LauncherError, match="launcher exited"):
        launcher._check_alive()
