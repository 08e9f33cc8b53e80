"""Reading one proxy request head off an accepted socket, within its deadline: the proxy listeners' I/O around
the shared sans-I/O reader (``supervisor/protocol/request_head.py``, ``proxy_head.proxy_event``).

Both daemons' listeners use it (the boundary's ``127.0.0.1:3128`` and control's proxy-pod listener), so the
deadline means the same on both: it bounds the client's slowness, not ours. In a burst of connections on a loaded
machine a task can first look at its socket after the deadline; a read cancelled then would leave a head that
arrived in time unread (a ``400`` for a well-formed CONNECT). So at the deadline the bytes the kernel already
holds are read without waiting before the connection is refused.
"""

from __future__ import annotations

import os

import trio

from supervisor.protocol.proxy_head import ProxyReject, ProxyTarget, proxy_event
from supervisor.protocol.request_head import HeadReader

READ_SIZE = 65536


async def read_proxy_head(
    stream: trio.SocketStream, reader: HeadReader, deadline_s: float
) -> ProxyTarget | ProxyReject | None:
    """The proxy's reading of the first head, or ``None`` when none arrived whole: the client closed, or the
    deadline passed (``reader.received`` tells a client that sent nothing from a slow one)."""
    parsed: ProxyTarget | ProxyReject | None = None
    with trio.move_on_after(deadline_s):
        while parsed is None:
            try:
                data = await stream.receive_some(READ_SIZE)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                break
            reader.receive_data(data)
            parsed = proxy_event(reader)
    if parsed is None:
        parsed = _arrived_by_now(stream, reader)
    return parsed


def _arrived_by_now(stream: trio.SocketStream, reader: HeadReader) -> ProxyTarget | ProxyReject | None:
    """What the bytes the kernel already holds for this connection make, read without waiting."""
    parsed: ProxyTarget | ProxyReject | None = None
    while parsed is None:
        try:
            data = os.read(stream.socket.fileno(), READ_SIZE)  # non-blocking: trio's sockets are
        except OSError:  # BlockingIOError: nothing more has arrived; a reset: nothing will
            break
        if not data:
            break
        reader.receive_data(data)
        parsed = proxy_event(reader)
    return parsed
