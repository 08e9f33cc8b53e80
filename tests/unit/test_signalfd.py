"""``linux.signalfd`` / ``linux.read_signals``: how a waiting spare exec-init learns of a signal it blocks
(zygote ``_await_command``). In this process, no child: a blocked signal raised at this thread is pending, and the
signalfd reports it (and takes it); one outside its set is left alone. Thread-directed (``pthread_kill``), never
process-directed: another thread of the test process (trio's worker threads) does not block them, and would be
killed by their default action."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Iterator

import pytest

from supervisor.boundary.forkimage import linux


@pytest.fixture
def blocked() -> Iterator[set[int]]:
    """SIGUSR1 and SIGUSR2 blocked for the test, anything pending of them taken, the mask restored after."""
    signals = {signal.SIGUSR1, signal.SIGUSR2}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield signals
    finally:
        while signal.sigtimedwait(signals, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def test_a_pending_signal_of_its_set_is_read_once(blocked: set[int]) -> None:
    fd = linux.signalfd([signal.SIGUSR1])
    try:
        assert linux.read_signals(fd) == []  # nothing pending: non-blocking, empty
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(5000), "the signalfd did not become readable"
        assert linux.read_signals(fd) == [signal.SIGUSR1]
        assert linux.read_signals(fd) == []  # taken
        assert signal.sigpending() & blocked == set()
    finally:
        os.close(fd)


def test_a_signal_outside_its_set_stays_pending_and_unread(blocked: set[int]) -> None:
    fd = linux.signalfd([signal.SIGUSR1])
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)
        assert signal.SIGUSR2 in signal.sigpending()
        assert linux.read_signals(fd) == []
        assert signal.SIGUSR2 in signal.sigpending()  # still there for whoever waits for it
    finally:
        os.close(fd)


def test_the_signalfd_is_close_on_exec(blocked: set[int]) -> None:
    fd = linux.signalfd([signal.SIGUSR1])
    try:
        assert not os.get_inheritable(fd)  # an exec-init's commands never hold it
    finally:
        os.close(fd)
