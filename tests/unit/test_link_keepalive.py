"""Link sockets carry TCP keepalive and a user timeout, so a peer that vanished without a FIN is noticed.

Found with real pods (tests/k8s): a deleted workload pod never closed control's links, and control,
which sends nothing while the agent runs, stayed attached (and ready) to a boundary that was gone.
"""

from __future__ import annotations

import socket

import trio

from supervisor.link.tls_link import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    USER_TIMEOUT_MS,
    set_keepalive,
)


def _options(sock: trio.socket.SocketType) -> tuple[int, int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    )


async def test_both_ends_of_a_tcp_link_get_keepalive_and_a_user_timeout() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    dialed = await trio.open_tcp_stream("127.0.0.1", port)
    accepted = await listeners[0].accept()
    try:
        assert _options(dialed.socket)[0] == 0  # not on by default: the call does it
        for stream in (dialed, accepted):
            set_keepalive(stream)
            assert _options(stream.socket) == (1, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT,
                                               USER_TIMEOUT_MS)  # fmt: skip
        assert KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT <= 60
    finally:
        await dialed.aclose()
        await accepted.aclose()
        await listeners[0].aclose()


async def test_a_unix_stream_is_left_alone() -> None:
    left, right = trio.socket.socketpair()
    try:
        set_keepalive(trio.SocketStream(left))  # no error, nothing set
        assert left.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    finally:
        left.close()
        right.close()
