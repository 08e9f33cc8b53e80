"""Control's API tells a client that went away from one that half-closed (supervisor/control/api.py
``_HangupAware``): the first must abort the channel relay (so the boundary's stream is reset and the exec's
output is kept for ``attach``), the second is an exec's stdin EOF and must stay a clean EOF. A client that
closes once the channel's far side has ended (it read the EXIT) ends the relay cleanly: nothing is left to keep."""

from __future__ import annotations

import math
import socket

import pytest
import trio

from supervisor.control.api import _HangupAware
from supervisor.link.relay import relay


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


async def test_a_client_closing_after_the_far_side_ended_is_a_clean_eof() -> None:
    stream, client = _pair()
    ended = False
    wrapped = _HangupAware(stream, lambda: ended)
    client.sendall(b"frame")
    client.close()
    assert await wrapped.receive_some(100) == b"frame"
    ended = True  # the boundary's last frame (EXIT, END_STREAM) arrived before the client closed
    assert await wrapped.receive_some(100) == b""
    await wrapped.aclose()


async def test_the_relay_ends_cleanly_when_the_client_closes_after_the_far_side_ended() -> None:
    """control's channel relay: the far side ends (an exec's EXIT and END_STREAM), the client reads it and closes
    its connection — a clean end (the boundary's stream is closed, not reset)."""
    api_ours, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    far_ours, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ended = False
    api_side = _HangupAware(trio.SocketStream(trio.socket.from_stdlib_socket(api_ours)), lambda: ended)
    far.sendall(b"EXIT")
    far.shutdown(socket.SHUT_WR)
    ended = True
    got: list[bytes] = []

    async def client_reads_and_goes() -> None:
        got.append(await trio.to_thread.run_sync(client.recv, 100))
        client.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_reads_and_goes)
        stats = await relay(
            api_side, trio.SocketStream(trio.socket.from_stdlib_socket(far_ours)), idle_timeout=math.inf
        )
    assert got == [b"EXIT"]
    assert stats.error is None
    far.close()
