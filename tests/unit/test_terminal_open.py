"""The launch terminal's opening (supervisor/boundary/forkimage/terminal.py): both ends close-on-exec, never a
controlling terminal, sized, and the slave is the master's own peer."""

from __future__ import annotations

import fcntl
import os
import struct
import termios

from supervisor.boundary.forkimage.terminal import open_pty


def test_open_pty_gives_a_sized_peer_pair_that_no_exec_inherits() -> None:
    master, slave = open_pty(33, 101)
    try:
        for fd in (master, slave):
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\0" * 8))
        assert (rows, cols) == (33, 101)
        assert os.ttyname(slave).startswith("/dev/pts/")
        os.write(master, b"ping\n")
        assert os.read(slave, 100) == b"ping\n"
    finally:
        os.close(master)
        os.close(slave)
