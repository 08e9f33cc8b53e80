"""Endpoints without L7 rules (``raw_fallback``): what is neither TLS nor HTTP is relayed raw, an origin that
speaks first makes the connection raw — but an HTTP origin's unsolicited answer (a 408) never does, and
anything HTTP is still bound to the tunnel's authority (docs/design.md "Sniffing"). In-memory streams, virtual time.
"""

from __future__ import annotations

import io

import trio
import trio.testing

from supervisor.control.credentials import Credentials
from supervisor.control.l7 import InspectStats, InterceptionCA, Limits, inspect, upstream_context
from supervisor.control.policy import BinaryIdentity, L4Request, PolicyStore, compile_policy, load_policy_text
from supervisor.jsonlog import JsonLog

POLICY = """
version: 1
network_policies:
  plain:
    endpoints: [{host: db.test, port: 5432}]
    binaries: [{path: /usr/bin/psql}]
"""
_CA = InterceptionCA.generate("raw-fallback-tests")


async def _inspect(agent_side: trio.abc.HalfCloseableStream, upstream_side: trio.abc.HalfCloseableStream,
                   log: io.StringIO) -> InspectStats:  # fmt: skip
    snapshot = PolicyStore(compile_policy(load_policy_text(POLICY, "p.yaml")), source="p.yaml").snapshot()
    l4 = snapshot.decide_l4(L4Request("db.test", 5432, BinaryIdentity("/usr/bin/psql", None)))

    async def dial() -> trio.abc.HalfCloseableStream:
        raise AssertionError("the early upstream is the only one")

    return await inspect(agent_side, host="db.test", port=5432, tls=None, snapshot=snapshot, l4=l4,
                         connect_upstream=dial, ca=_CA, credentials=Credentials.from_mapping({}),
                         upstream_ssl=upstream_context(system_trust=False), log=JsonLog("control", stream=log),
                         limits=Limits(idle_timeout=30), raw_fallback=True, early_upstream=upstream_side)  # fmt: skip


async def _read_until(stream: trio.abc.Stream, size: int) -> bytes:
    out = bytearray()
    while len(out) < size and (data := await stream.receive_some(65536)):
        out += data
    return bytes(out)


async def test_bytes_that_are_neither_tls_nor_http_are_relayed_untouched(autojump_clock: trio.testing.MockClock
                                                                          ) -> None:  # fmt: skip
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, upstream = trio.testing.memory_stream_pair()
    startup = b"\x00\x00\x00\x08\x04\xd2\x16\x2f"  # a PostgreSQL SSLRequest
    got: dict[str, bytes] = {}

    async def origin() -> None:
        got["origin"] = await _read_until(upstream, len(startup))
        await upstream.send_all(b"N")
        await upstream.aclose()

    async def client() -> None:
        await agent.send_all(startup)
        got["agent"] = await _read_until(agent, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(origin)
        nursery.start_soon(client)
        stats = await _inspect(agent_side, upstream_side, io.StringIO())
    assert got == {"origin": startup, "agent": b"N"} and stats.protocol == "unknown"


async def test_an_origin_that_speaks_first_makes_the_connection_raw(autojump_clock: trio.testing.MockClock) -> None:
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, upstream = trio.testing.memory_stream_pair()
    got: dict[str, bytes] = {}

    async def origin() -> None:
        await upstream.send_all(b"220 mail.test ESMTP\r\n")
        got["origin"] = await _read_until(upstream, 8)
        await upstream.aclose()

    async def client() -> None:
        got["banner"] = await _read_until(agent, 21)
        await agent.send_all(b"EHLO a\r\n")
        got["end"] = await _read_until(agent, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(origin)
        nursery.start_soon(client)
        await _inspect(agent_side, upstream_side, io.StringIO())
    assert got == {"banner": b"220 mail.test ESMTP\r\n", "origin": b"EHLO a\r\n", "end": b""}


async def test_an_http_origins_unsolicited_answer_never_opens_a_raw_tunnel(autojump_clock: trio.testing.MockClock
                                                                            ) -> None:  # fmt: skip
    """A 408 after the origin's own timeout, then the agent fronts: the tunnel is closed, nothing goes up."""
    agent_side, agent = trio.testing.memory_stream_pair()
    upstream_side, upstream = trio.testing.memory_stream_pair()
    answer = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"
    reached = bytearray()

    async def origin() -> None:
        await upstream.send_all(answer)
        while data := await upstream.receive_some(65536):
            reached.extend(data)

    async def client() -> bytes:
        seen = await _read_until(agent, len(answer))
        try:
            await agent.send_all(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        except trio.BrokenResourceError:
            pass
        return seen

    log = io.StringIO()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(origin)
        nursery.start_soon(client)
        stats = await _inspect(agent_side, upstream_side, log)
    assert bytes(reached) == b"" and stats.closed_by == "upstream"
    assert "origin-answered-first" in log.getvalue()
