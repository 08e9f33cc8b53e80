"""Peer contenders as real processes: loopback only, a working tunnel, nothing left behind.

These start tinyproxy, squid and proxy.py when they are installed (``python3 bench/run.py`` installs
them) and skip, saying so, when they are not.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.clients import one_exchange
from bench.contenders import (
    FACTORIES,
    BenchContext,
    ContenderUnavailable,
    ProcessContender,
)
from bench.harness import Upstream
from bench.procstat import bound_sockets, start_time
from bench.setup_peers import PEERS_VENV


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


@pytest.fixture
def ctx(tmp_path: Path) -> BenchContext:
    return BenchContext(tmp_path, PEERS_VENV, 4096)


@pytest.mark.parametrize("name", ["tinyproxy", "squid", "proxy.py"])
def test_peer_serves_loopback_only_and_leaves_nothing(name: str, ctx: BenchContext, upstream: Upstream) -> None:
    contender = FACTORIES[name](ctx)
    try:
        proxy = contender.start()
    except ContenderUnavailable as exc:
        pytest.skip(f"{name} unavailable here: {exc}")
    try:
        assert proxy is not None and proxy[0] == "127.0.0.1"
        pids = contender.pids()
        assert pids
        sockets = bound_sockets(pids)
        assert any(s.listening and s.port == proxy[1] for s in sockets)
        assert all(s.address.is_loopback for s in sockets), sockets
        assert one_exchange(proxy, contender.target(upstream.echo), timeout=10)[0] > 0
        started = {pid: start_time(pid) for pid in pids}
    finally:
        contender.stop()
    assert all(start_time(pid) != when for pid, when in started.items()), "a peer process outlived stop()"
    contender.stop()  # a second stop is harmless


class WildcardListener(ProcessContender):
    """A stand-in peer that does what no contender may: listen on every address."""

    name = "wildcard"

    def command(self) -> list[str]:
        code = (
            f"import socket, time\ns = socket.socket(); s.bind(('0.0.0.0', {self.port})); s.listen()\ntime.sleep(60)\n"
        )
        return [sys.executable, "-c", code]


def test_peer_listening_beyond_loopback_is_refused_and_stopped(ctx: BenchContext) -> None:
    contender = WildcardListener(ctx)
    with pytest.raises(ContenderUnavailable, match="beyond loopback"):
        contender.start()
    assert contender.proc is None and contender.pids() == []
