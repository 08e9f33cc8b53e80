"""A fresh fork made a clean single-purpose process of the fork image: its signals, its fds, its SIGCHLD
wakeup (zygote.py rule 1: no thread, so a pipe and ``poll``)."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import signal
from typing import Final

from . import linux


def install_sigchld_wakeup() -> int:
    """Route SIGCHLD to a non-blocking pipe watched by ``poll``; returns the read end."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    return rfd


def drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


# What a forked helper ignores: SIGPIPE (a vanished peer is an EPIPE, not a death), and what a terminal sends
# its foreground group — Ctrl-C in dev mode reaches the launcher too, but only the boundary decides when the
# workload ends (and PR_SET_PDEATHSIG ends us with it).
_IGNORED: Final = (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def reset_process(keep: list[int]) -> None:
    """Make a fresh fork a clean single-purpose process: default signals (SIGPIPE ignored), ``keep[i]`` moved
    to fd ``3 + i``, every other fd closed, /dev/null on 0-2, and inherited objects never finalised."""
    signal.set_wakeup_fd(-1)  # the boundary's wakeup fd number means nothing here
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    keep_fds(keep)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)
    gc.freeze()  # objects inherited from the boundary may own fd numbers: never let them be finalised


def keep_fds(keep: list[int]) -> None:
    """``keep[i]`` moved to fd ``3 + i`` (close-on-exec), every other fd above 2 closed."""
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in keep]
    for index, fd in enumerate(lifted):
        os.dup2(fd, 3 + index, inheritable=False)
    linux.close_range(3 + len(keep))
