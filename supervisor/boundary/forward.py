"""Forward: one byte stream to a validated loopback target inside the workload (docs/reference/boundary.md §3).

The target is checked by :func:`supervisor.protocol.process_ops.validate_forward_target` (loopback literal or
``localhost``, never a name that would need a resolver, never one of the boundary's own ports); the socket is
created by the launcher *inside the agent's network namespace*, so ``127.0.0.1`` means the workload's
loopback, never the boundary's. Connect is bounded to 5 s; a refused connection is ``failed``.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Collection
from typing import Final, Protocol

import trio

from supervisor.protocol.errors import ErrorKind, OpError
from supervisor.protocol.process_ops import validate_forward_target

__all__ = ["CONNECT_TIMEOUT_S", "open_forward"]

CONNECT_TIMEOUT_S: Final = 5.0


class NetnsSockets(Protocol):
    async def socket_in_netns(self, family: int, type: int) -> socket.socket: ...


async def open_forward(
    launcher: NetnsSockets, host: object, port: object, reserved_ports: Collection[int]
) -> trio.SocketStream:
    target = validate_forward_target(host, port, reserved_ports)
    try:
        raw = await launcher.socket_in_netns(target.family, socket.SOCK_STREAM)
    except OSError as exc:
        raise OpError(ErrorKind.FAILED, f"no socket in the workload: {exc.strerror}", errno=exc.errno) from None
    sock = trio.socket.from_stdlib_socket(raw)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            await sock.connect((target.host, target.port))
    except trio.TooSlowError:
        sock.close()
        raise OpError(ErrorKind.FAILED, f"connect to {target.host}:{target.port} timed out") from None
    except OSError as exc:
        sock.close()
        what = "refused" if exc.errno == errno.ECONNREFUSED else (exc.strerror or "failed")
        raise OpError(ErrorKind.FAILED, f"connect to {target.host}:{target.port}: {what}", errno=exc.errno) from None
    except BaseException:
        sock.close()
        raise
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return trio.SocketStream(sock)
