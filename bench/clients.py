"""The one client every contender is measured with.

Rules:
1. Same code path for every contender: ``proxy is None`` (direct) only skips the CONNECT exchange.
2. Blocking sockets where one connection is measured at a time (bulk, sequential setup): they have the
   least client overhead. asyncio's ``sock_*`` calls where many are in flight (concurrent setup, idle
   holds): one thread, no GIL hand-offs, cheap enough that the client is not the bottleneck.
3. A setup sample is the full connect + CONNECT + 1 KiB request/response, timed by the client.
4. The upstream closes first (see ``bench.upstream``): after its clock stops, the client waits for the
   upstream's FIN (at most ``EOF_WAIT`` seconds) before it closes, so no TIME_WAIT lands on our side.
5. Nothing here retries: a failed connection is counted, never hidden, and so is its kind
   (``error_kinds``: exception type and message, e.g. ``TunnelRefused: CONNECT refused: 403 Forbidden``).
6. Every batch has a time budget: a slow contender measures fewer connections instead of holding up
   the run, and the number it reached is part of the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.wire import (
    ECHO_SIZE,
    UPLOAD_ACK,
    Direction,
    WireError,
    connect_request,
    encode_bulk_header,
    parse_connect_reply,
    proxy_authorizations,
)

Address = tuple[str, int]
CHUNK = 1024 * 1024
EOF_WAIT = 5.0
REQUEST = bytes(range(256)) * (ECHO_SIZE // 256)
# Proxies this client's environment names with userinfo (the proxy-pod sandbox's agent): they get the header.
PROXY_AUTHORIZATION = proxy_authorizations(os.environ)


def _connect_request(proxy: Address, target: Address) -> bytes:
    return connect_request(*target, authorization=PROXY_AUTHORIZATION.get((proxy[0], proxy[1])))


class TunnelRefused(WireError):
    """The proxy answered CONNECT with something other than 2xx."""


def error_kind(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


def _new_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _check_reply(buffer: bytes) -> bool:
    reply = parse_connect_reply(buffer)
    if reply is None:
        return False
    if not 200 <= reply.status < 300:
        raise TunnelRefused(f"CONNECT refused: {reply.status} {reply.reason}")
    if reply.leftover:
        raise WireError("proxy sent tunnel bytes before the upstream spoke")
    return True


def open_tunnel(proxy: Address | None, target: Address, timeout: float,
                marks: list[float] | None = None) -> socket.socket:  # fmt: skip
    """A blocking socket whose next byte reaches ``target`` (through ``proxy`` when given). ``marks`` gets the
    ``perf_counter`` once connected and once the CONNECT's answer was read (again at once without a proxy)."""
    sock = _new_socket()
    sock.settimeout(timeout)
    try:
        sock.connect(proxy or target)
        if marks is not None:
            marks.append(time.perf_counter())
        if proxy is not None:
            sock.sendall(_connect_request(proxy, target))
            buffer = b""
            while not _check_reply(buffer):
                chunk = sock.recv(4096)
                if not chunk:
                    raise WireError("proxy closed during CONNECT")
                buffer += chunk
        if marks is not None:
            marks.append(time.perf_counter())
    except BaseException:
        sock.close()
        raise
    return sock


def _await_eof(sock: socket.socket) -> None:
    """Read until the peer's FIN (untimed: after the measurement), so that it is the side that closed first."""
    sock.settimeout(EOF_WAIT)
    try:
        while sock.recv(CHUNK):
            pass
    except OSError:
        pass


async def _async_await_eof(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(EOF_WAIT):
            while await loop.sock_recv(sock, 4096):
                pass


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise WireError(f"connection closed {len(view) - got} bytes short")
        got += n


@dataclass(frozen=True)
class BulkResult:
    size: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.size / self.seconds / 1e6


def bulk(proxy: Address | None, target: Address, direction: Direction, size: int, timeout: float) -> BulkResult:
    """Move ``size`` bytes to (UP) or from (DOWN) the upstream through one tunnel."""
    with open_tunnel(proxy, target, timeout) as sock:
        buffer = memoryview(bytearray(CHUNK))
        start = time.perf_counter()
        sock.sendall(encode_bulk_header(direction, size))
        remaining = size
        if direction is Direction.UP:
            while remaining:
                n = min(remaining, CHUNK)
                sock.sendall(buffer[:n])
                remaining -= n
            _recv_exact_into(sock, memoryview(bytearray(len(UPLOAD_ACK))))
        else:
            while remaining:
                n = sock.recv_into(buffer, min(remaining, CHUNK))
                if not n:
                    raise WireError(f"download ended {remaining} bytes short")
                remaining -= n
        seconds = time.perf_counter() - start
        _await_eof(sock)
        return BulkResult(size, seconds)


# The steps of one sequential setup sample, in order (``SetupResult.steps``): where its latency goes.
STEPS = ("connect", "CONNECT", "exchange")


def one_exchange(proxy: Address | None, target: Address, timeout: float) -> list[float]:
    """Seconds for connect + CONNECT + 1 KiB request/response, and of each step (``STEPS``): the TCP connect to
    the proxy (or the target), the CONNECT until its answer (0 without a proxy), the request until its echo."""
    start = time.perf_counter()
    marks = [start]
    with open_tunnel(proxy, target, timeout, marks) as sock:
        sock.sendall(REQUEST)
        _recv_exact_into(sock, memoryview(bytearray(ECHO_SIZE)))
        end = time.perf_counter()
        _await_eof(sock)
    marks.append(end)
    return [end - start] + [later - earlier for earlier, later in itertools.pairwise(marks)]


@dataclass(frozen=True)
class SetupResult:
    latencies: list[float]  # seconds, one per successful connection
    errors: int
    seconds: float  # wall time of the whole batch
    error_kinds: dict[str, int] = field(default_factory=dict)
    # per step of ``STEPS``, its seconds in each successful connection (sequential setup only)
    steps: dict[str, list[float]] = field(default_factory=dict)

    @property
    def conns_per_s(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def setup_sequential(proxy: Address | None, target: Address, count: int, timeout: float, budget: float) -> SetupResult:
    """Up to ``count`` exchanges one after another, stopping early once ``budget`` seconds have passed."""
    latencies: list[float] = []
    steps: dict[str, list[float]] = {step: [] for step in STEPS}
    kinds: Counter[str] = Counter()
    start = time.perf_counter()
    for _ in range(count):
        if time.perf_counter() - start > budget:
            break
        try:
            total, *parts = one_exchange(proxy, target, timeout)
        except (OSError, WireError) as exc:
            kinds[error_kind(exc)] += 1
            continue
        latencies.append(total)
        for step, seconds in zip(STEPS, parts, strict=True):
            steps[step].append(seconds)
    return SetupResult(latencies, kinds.total(), time.perf_counter() - start, dict(kinds), steps)


async def _async_tunnel(proxy: Address | None, target: Address) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = _new_socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, proxy or target)
        if proxy is not None:
            await loop.sock_sendall(sock, _connect_request(proxy, target))
            buffer = b""
            while not _check_reply(buffer):
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk:
                    raise WireError("proxy closed during CONNECT")
                buffer += chunk
    except BaseException:
        sock.close()
        raise
    return sock


async def _async_exchange(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, REQUEST)
    got = 0
    while got < ECHO_SIZE:
        chunk = await loop.sock_recv(sock, ECHO_SIZE - got)
        if not chunk:
            raise WireError("echo closed early")
        got += len(chunk)


async def _setup_concurrent(
    proxy: Address | None, target: Address, count: int, concurrency: int, conn_timeout: float, budget: float
) -> SetupResult:
    latencies: list[float] = []
    kinds: Counter[str] = Counter()
    todo = count

    async def worker() -> None:
        nonlocal todo
        while todo > 0 and time.perf_counter() < deadline:
            todo -= 1
            start = time.perf_counter()
            try:
                async with asyncio.timeout(conn_timeout):
                    sock = await _async_tunnel(proxy, target)
                    with sock:
                        await _async_exchange(sock)
                        latencies.append(time.perf_counter() - start)
                        await _async_await_eof(sock)
            except (OSError, WireError, TimeoutError) as exc:
                kinds[error_kind(exc)] += 1

    start = time.perf_counter()
    deadline = start + budget
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return SetupResult(latencies, kinds.total(), time.perf_counter() - start, dict(kinds))


def setup_concurrent(
    proxy: Address | None, target: Address, count: int, concurrency: int, timeout: float, budget: float
) -> SetupResult:
    """``count`` exchanges by ``concurrency`` workers; none starts after ``budget`` seconds."""
    return asyncio.run(_setup_concurrent(proxy, target, count, concurrency, timeout, budget))


@dataclass
class IdleHold:
    """Connections that completed one echo and are now held open doing nothing."""

    sockets: list[socket.socket]
    errors: int
    seconds: float  # time to open them all
    error_kinds: dict[str, int] = field(default_factory=dict)

    def close(self, timeout: float = 30.0) -> None:
        """End the hold the upstream's way: one more byte asks it to close, we close on its FIN.

        The upstream closing first keeps TIME_WAIT out of our (and every proxy's) port space; see
        ``bench.upstream``. A connection that does not end within ``timeout`` is just closed.
        """
        if self.sockets:
            asyncio.run(_release(self.sockets, timeout))
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


async def _release(sockets: list[socket.socket], within: float) -> None:
    loop = asyncio.get_running_loop()

    async def one(sock: socket.socket) -> None:
        try:
            await loop.sock_sendall(sock, b"!")
            while await loop.sock_recv(sock, 4096):
                pass
        except OSError:
            pass

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within), asyncio.TaskGroup() as group:
            for sock in sockets:
                group.create_task(one(sock))


async def _open_idle(
    proxy: Address | None, target: Address, count: int, concurrency: int, conn_timeout: float, budget: float
) -> IdleHold:
    held: list[socket.socket] = []
    kinds: Counter[str] = Counter()
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            if time.perf_counter() > deadline:
                return  # not attempted: the caller sees fewer held connections, not failures
            try:
                async with asyncio.timeout(conn_timeout):
                    sock = await _async_tunnel(proxy, target)
                    try:
                        await _async_exchange(sock)
                    except BaseException:
                        sock.close()
                        raise
            except (OSError, WireError, TimeoutError) as exc:
                kinds[error_kind(exc)] += 1
                return
            held.append(sock)

    start = time.perf_counter()
    deadline = start + budget
    async with asyncio.TaskGroup() as group:
        for _ in range(count):
            group.create_task(one())
    return IdleHold(held, kinds.total(), time.perf_counter() - start, dict(kinds))


def open_idle(
    proxy: Address | None, target: Address, count: int, concurrency: int, timeout: float, budget: float
) -> IdleHold:
    """Open up to ``count`` tunnels, each proven by one echo; none is started after ``budget`` seconds."""
    return asyncio.run(_open_idle(proxy, target, count, concurrency, timeout, budget))
