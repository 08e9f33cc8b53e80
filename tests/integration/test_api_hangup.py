"""Control's API tells a client that went away from one that half-closed (supervisor/control/api.py
``_HangupAware``): the first must abort the channel relay (so the boundary's stream is reset and the exec's
output is kept for ``attach``), the second is an exec's stdin EOF and must stay a clean EOF."""

from __future__ import annotations

import socket

import pytest
import trio

from supervisor.control.api import _HangupAware


def _pair() -> tuple[trio.SocketStream, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


async def test_a_half_close_is_a_clean_eof() -> None:
    stream, client = _pair()
    wrapped = _HangupAware(stream)
    client.sendall(b"frame")
    client.shutdown(socket.SHUT_WR)
    assert await wrapped.receive_some(100) == b"frame"
    assert await wrapped.receive_some(100) == b""  # stdin EOF, nothing more
    await wrapped.send_all(b"output still flows")  # the client reads on after its half-close
    assert client.recv(100) == b"output still flows"
    client.close()
    await wrapped.aclose()


async def test_a_client_that_died_is_a_broken_stream() -> None:
    stream, client = _pair()
    wrapped = _HangupAware(stream)
    client.sendall(b"frame")
    client.close()  # what SIGKILL does to the CLI's socket
    assert await wrapped.receive_some(100) == b"frame"
    with pytest.raises(trio.BrokenResourceError, match="closed its connection"):
        await wrapped.receive_some(100)
    assert wrapped.transport_stream is stream
    await wrapped.aclose()
