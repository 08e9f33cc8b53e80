"""The client against the real upstream (loopback) and against misbehaving proxies."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import clients
from bench.harness import Upstream
from bench.wire import Direction, WireError


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


@pytest.mark.parametrize("direction", list(Direction))
def test_bulk_moves_every_byte(upstream: Upstream, direction: Direction) -> None:
    result = clients.bulk(None, upstream.bulk, direction, 3 * clients.CHUNK + 17, timeout=10)
    assert result.size == 3 * clients.CHUNK + 17 and result.mb_per_s > 0


def test_setup_batches_count_every_connection(upstream: Upstream) -> None:
    sequential = clients.setup_sequential(None, upstream.echo, 40, timeout=10, budget=30)
    assert len(sequential.latencies) == 40 and sequential.errors == 0
    concurrent = clients.setup_concurrent(None, upstream.echo, 100, 16, timeout=10, budget=30)
    assert len(concurrent.latencies) == 100 and concurrent.errors == 0


def test_a_sequential_sample_is_split_into_its_steps(upstream: Upstream) -> None:
    result = clients.setup_sequential(None, upstream.echo, 20, timeout=10, budget=30)
    assert list(result.steps) == list(clients.STEPS)
    assert all(len(seconds) == len(result.latencies) == 20 for seconds in result.steps.values())
    for index, total in enumerate(result.latencies):
        parts = [result.steps[step][index] for step in clients.STEPS]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(total)
        assert result.steps["exchange"][index] > result.steps["CONNECT"][index]  # no proxy: nothing to wait for


def test_budget_stops_a_batch_early(upstream: Upstream) -> None:
    result = clients.setup_sequential(None, upstream.echo, 10**6, timeout=10, budget=0.2)
    assert 0 < len(result.latencies) < 10**6


def test_idle_connections_are_held_until_closed(upstream: Upstream) -> None:
    hold = clients.open_idle(None, upstream.idle, 50, 10, timeout=10, budget=30)
    try:
        assert len(hold.sockets) == 50 and hold.errors == 0
        assert all(s.fileno() >= 0 for s in hold.sockets)
    finally:
        hold.close()
    assert hold.sockets == []


def _time_wait_ports() -> list[tuple[int, int]]:
    """(local port, remote port) of every IPv4 TCP socket in TIME_WAIT in this namespace."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "06":
            found.append((int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)))
    return found


def test_upstream_closes_first_so_no_client_keeps_time_wait(upstream: Upstream) -> None:
    earlier = set(_time_wait_ports())  # an earlier test's server may have had this ephemeral port number
    assert len(clients.setup_sequential(None, upstream.echo, 20, timeout=10, budget=30).latencies) == 20
    assert len(clients.setup_concurrent(None, upstream.echo, 20, 5, timeout=10, budget=30).latencies) == 20
    hold = clients.open_idle(None, upstream.idle, 20, 5, timeout=10, budget=30)
    hold.close()
    for direction in Direction:
        clients.bulk(None, upstream.bulk, direction, 1000, timeout=10)
    waits = [w for w in _time_wait_ports() if w not in earlier]
    ports = {upstream.echo[1], upstream.idle[1], upstream.bulk[1]}
    assert not [w for w in waits if w[1] in ports], "a client closed first and holds TIME_WAIT"
    assert sum(1 for w in waits if w[0] == upstream.echo[1]) >= 40  # they are the upstream's, as designed
    assert sum(1 for w in waits if w[0] == upstream.idle[1]) >= 20


class FakeProxy:
    """A loopback 'proxy' answering every CONNECT with fixed bytes, to play the misbehaving peer."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", clients.TunnelRefused),
        (b"HTTP/1.1 200 OK\r\n\r\nsurprise", WireError),
        (b"HTTP/1.1 200 OK\r\n", WireError),  # closes before the header ends
        (b"220 smtp ready\r\n\r\n", WireError),
    ],
)
def test_client_refuses_a_bad_tunnel(answer: bytes, error: type[Exception]) -> None:
    proxy = FakeProxy(answer)
    try:
        with pytest.raises(error):
            clients.open_tunnel(proxy.address, ("127.0.0.1", 9), timeout=5)
        result = clients.setup_sequential(proxy.address, ("127.0.0.1", 9), 3, timeout=5, budget=10)
        assert result.latencies == [] and result.errors == 3
        assert [k.split(":")[0] for k in result.error_kinds] == [error.__name__]  # what they failed with, too
        assert sum(result.error_kinds.values()) == 3
        concurrent = clients.setup_concurrent(proxy.address, ("127.0.0.1", 9), 4, 2, timeout=5, budget=10)
        assert concurrent.latencies == [] and concurrent.errors == 4
        assert sum(concurrent.error_kinds.values()) == 4
    finally:
        proxy.close()
