"""The launcher's wire (zygote.py): ``SOCK_SEQPACKET``, one JSON object per message, fds as ``SCM_RIGHTS``.

Requests carry ``op`` and ``id``; replies carry the same ``id`` and ``ok``; exits are unsolicited. Received fds
are close-on-exec, and a malformed or truncated message closes its fds."""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Final

from supervisor.protocol.json_value import JsonValue, is_json_object

MAX_MESSAGE: Final = 1 << 20
MAX_SPEC: Final = 256 * 1024  # argv + env + the rest, encoded; below any default socket send buffer
MAX_FDS: Final = 32
SOCKET_BUFFER: Final = 1 << 20
_INT_SIZE: Final = array.array("i").itemsize


def encode(message: Mapping[str, JsonValue]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def send(sock: socket.socket, message: Mapping[str, JsonValue], fds: Iterable[int] = ()) -> None:
    data = encode(message)
    if len(data) > MAX_MESSAGE:  # the peer's receive buffer would truncate it
        raise OSError(errno.EMSGSIZE, f"launcher message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    socket.send_fds(sock, [data], list(fds))


def decode(data: bytes, fds: list[int], flags: int) -> tuple[dict[str, JsonValue], list[int]]:
    """Parse one received message; on a truncated or malformed one close its fds and raise."""
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        close_all(fds)
        raise OSError(errno.EMSGSIZE, "launcher message truncated")
    try:
        message = json.loads(data)
        if not is_json_object(message):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply for json
        close_all(fds)
        raise OSError(errno.EPROTO, f"bad launcher message: {exc}") from None
    return message, fds


def receive(sock: socket.socket, *, nowait: bool = False) -> tuple[dict[str, JsonValue], list[int]] | None:
    """One message, or ``None`` at EOF. Blocks if the socket does, unless ``nowait`` (then BlockingIOError).

    Not ``socket.recv_fds``: on 3.11 it ignores its flags, and we need ``MSG_CMSG_CLOEXEC`` (received fds
    must never leak into an exec) and ``MSG_DONTWAIT``.
    """
    want = socket.MSG_CMSG_CLOEXEC | (socket.MSG_DONTWAIT if nowait else 0)
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * _INT_SIZE), want)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[: len(payload) - len(payload) % _INT_SIZE])
    if not data:
        close_all(fds)
        return None
    return decode(data, fds, flags)


def close_all(fds: Iterable[int]) -> None:
    """Close ``fds``; a list is emptied too, so a second call cannot close a reused fd number."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if isinstance(fds, list):
        fds.clear()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    return a, b
