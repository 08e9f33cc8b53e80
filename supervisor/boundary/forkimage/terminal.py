"""A launch's terminal, opened where the workload's ``/dev`` is (docs/design.md "Terminals").

Rules:

1. The PTY is opened by the process that starts the command — the workload PID namespace's init, a spare
   exec-init, or the launcher where there is no PID namespace — from ``/dev/ptmx`` of its own mount namespace:
   in models R and U the agent's root, whose ``/dev/ptmx`` leads to the agent's own devpts instance, so the
   slave is a ``/dev/pts/N`` the agent can name (``tty``, ``ttyname``) and no terminal of the host's is ever
   involved. In model P there is no mount namespace: the pod's ``/dev/ptmx`` is the agent's too.
2. The slave is taken with ``TIOCGPTPEER`` (no path lookup between the master and its peer) and both ends are
   opened ``O_NOCTTY | O_CLOEXEC``: neither becomes anyone's controlling terminal here, and no ``execve`` carries
   either. The command's child makes the slave its controlling terminal (``child._ctty``) and keeps it as 0-2;
   the master goes to the boundary and every other copy is closed (the child's ``CLOSE_FDS`` stage closes the
   master before its ids change).
3. What the master can reach is the agent's devpts instance only: ``TIOCSTI`` by the agent lands in its own
   input, and the daemons never have a terminal of the agent's as their controlling terminal.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
from typing import Final

TIOCSPTLCK: Final = 0x40045431  # unlockpt(3)
TIOCGPTPEER: Final = 0x5441  # Linux 4.13: open the slave of this master
PTMX: Final = "/dev/ptmx"


def open_pty(rows: int, cols: int, ptmx: str = PTMX) -> tuple[int, int]:
    """``(master, slave)`` of a new PTY from ``ptmx``, sized ``rows`` x ``cols`` (rules 1 and 2)."""
    flags = os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC
    master = os.open(ptmx, flags)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, TIOCGPTPEER, flags)
        rows, cols = (max(1, min(v, 0xFFFF)) for v in (rows, cols))
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    except BaseException:
        os.close(master)
        raise
    return master, int(slave)
