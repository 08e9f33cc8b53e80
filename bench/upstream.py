"""The upstream every contender reaches: a bulk source/sink and a 1 KiB echo.

It runs as its own process (``python3 -m bench.upstream [--host ADDR]``) so that its CPU and file
descriptors are not the client's. It listens on 127.0.0.1 unless given the address of the harness's
upstream host (``tests/netns_hosts.py``), inside whose namespace it is then started. It prints
``READY <bulk_port> <echo_port> <idle_port>`` on stdout once its listeners are bound and exits when its
stdin closes (the harness died or is done) or on SIGTERM.

**The upstream closes first, always.** The side that closes first keeps the connection in TIME_WAIT for a
minute, and the kernel reuses a TIME_WAIT port for a new outgoing connection only on loopback
(``tcp_tw_reuse=2``, the default). Tens of thousands of connections per round to the one upstream address
on the veth would otherwise exhaust the ephemeral ports of every client and proxy (connects slowed to a
crawl, then refused). So: the bulk source shuts down first and the sink closes after its ack; the
**echo** listener (setup scenarios) closes right after echoing its 1 KiB; the **idle** listener echoes the
first 1 KiB, then closes as soon as any further byte arrives (the client's way of ending a hold). Every
TIME_WAIT then lives in the upstream's own namespace, where it costs nothing.

Why two engines: the echo side must hold 10,000 idle connections, which wants an event loop (asyncio
protocols are the cheapest in the standard library); the bulk side moves gigabytes over a handful of
connections, which blocking sockets in threads do fastest (the GIL is released in every syscall).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import socket
import sys
import threading

from bench.wire import ECHO_SIZE, UPLOAD_ACK, Direction, WireError, decode_bulk_header, encode_bulk_header

HOST = "127.0.0.1"
CHUNK = 1024 * 1024
BACKLOG = 4096
SERVER_TIMEOUT = 120.0  # a client that vanished mid-transfer frees its thread after this


def raise_nofile_soft_limit() -> int:
    """Raise the soft open-files limit to the hard one; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise WireError("peer closed before the bulk header was complete")
        data += chunk
    return bytes(data)


def serve_bulk_connection(sock: socket.socket) -> None:
    with sock:
        direction, size = decode_bulk_header(_recv_exact(sock, len(encode_bulk_header(Direction.UP, 0))))
        if direction is Direction.DOWN:
            payload = memoryview(bytes(CHUNK))
            remaining = size
            while remaining:
                n = min(remaining, CHUNK)
                sock.sendall(payload[:n])
                remaining -= n
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(CHUNK):  # wait for the client's close so no byte is cut short by a reset
                pass
        else:
            buffer = bytearray(CHUNK)
            remaining = size
            while remaining:
                n = sock.recv_into(buffer, min(remaining, CHUNK))
                if not n:
                    raise WireError(f"upload ended {remaining} bytes short")
                remaining -= n
            sock.sendall(UPLOAD_ACK)
            sock.shutdown(socket.SHUT_WR)  # we close first (see the module doc); the client closes on our FIN


def _bulk_accept_loop(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(SERVER_TIMEOUT)
        try:
            threading.Thread(target=_serve_quietly, args=(conn,), daemon=True).start()
        except RuntimeError:
            # No thread to be had (a shared machine can run out for a moment): serve it here rather
            # than let the accept loop die and every later transfer hang.
            _serve_quietly(conn)


def _serve_quietly(conn: socket.socket) -> None:
    with contextlib.suppress(OSError, WireError):
        serve_bulk_connection(conn)


class EchoProtocol(asyncio.Protocol):
    """Echo the client's 1 KiB, then close (our FIN first: see the module doc)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.received = 0

    def data_received(self, data: bytes) -> None:
        if self.received >= ECHO_SIZE:
            self.beyond_echo()
            return
        data = data[: ECHO_SIZE - self.received]
        self.received += len(data)
        self.transport.write(data)
        if self.received >= ECHO_SIZE:
            self.echoed()

    def echoed(self) -> None:
        self.transport.close()  # after the buffered echo is written

    def beyond_echo(self) -> None:
        self.transport.close()

    def eof_received(self) -> bool | None:
        return False  # close our side too


class HoldProtocol(EchoProtocol):
    """Echo the client's 1 KiB, then hold the connection until the client sends one more byte: then close."""

    def echoed(self) -> None:
        pass


def _listener(host: str, port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


async def serve(host: str) -> None:
    loop = asyncio.get_running_loop()
    bulk, echo, idle = _listener(host), _listener(host), _listener(host)
    threading.Thread(target=_bulk_accept_loop, args=(bulk,), daemon=True).start()
    server = await loop.create_server(EchoProtocol, sock=echo, backlog=BACKLOG)
    holder = await loop.create_server(HoldProtocol, sock=idle, backlog=BACKLOG)
    print(f"READY {bulk.getsockname()[1]} {echo.getsockname()[1]} {idle.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stdin = sys.stdin.fileno()
    loop.add_reader(stdin, lambda: None if os.read(stdin, 4096) else stop.set())
    async with server, holder:
        await stop.wait()
    bulk.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.upstream")
    parser.add_argument("--host", default=HOST, help="address to listen on (default %(default)s)")
    args = parser.parse_args(argv)
    raise_nofile_soft_limit()
    asyncio.run(serve(args.host))


if __name__ == "__main__":
    main()
