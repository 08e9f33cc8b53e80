"""A spawn request's fds (its ``stdio`` and ``notify`` fields index them): the stdio layout, the PTY opened
in the agent's mount namespace (terminal.py rule 1) and the connect-notify hand-off socket."""

from __future__ import annotations

import errno

from . import child, terminal
from .messages import SpawnRequest


def stdio_fds(
    request: SpawnRequest, fds: list[int], spec: child.SpawnSpec
) -> tuple[tuple[int, int, int], int, int | None]:
    """``(stdin, stdout, stderr), status, PTY master or None``. The layout indexes ``fds``: stdin, stdout,
    stderr and status; with a terminal, status alone, and the PTY is opened here (terminal.py rule 1): the slave
    is appended to ``fds`` (closed with them), the master is the caller's."""
    layout = request.stdio
    want = 1 if spec.tty else 4
    if len(layout) != want or not all(0 <= i < len(fds) for i in layout):
        raise OSError(errno.EINVAL, "bad stdio layout")
    if not spec.tty:
        return (fds[layout[0]], fds[layout[1]], fds[layout[2]]), fds[layout[3]], None
    master, slave = terminal.open_pty(spec.rows, spec.cols)
    fds.append(slave)
    return (slave, slave, slave), fds[layout[0]], master


def notify_fd(request: SpawnRequest, fds: list[int]) -> int | None:
    """The connect-notify hand-off socket the boundary sent with a spawn (``"notify"`` indexes ``fds``), if any."""
    index = request.notify
    if index is None:
        return None
    if not 0 <= index < len(fds):
        raise OSError(errno.EINVAL, "bad notify index")
    return fds[index]
