"""CPU of the link as the daemons run it: claim-less mTLS plus HTTP/2 (supervisor/link), both ends in this process
over loopback TCP.

Three kinds of rows; CPU is process CPU (``time.process_time``), which a loaded machine distorts far less than
wall time:

* **bulk**: one stream carrying ``--mb`` MiB one way; CPU per MB moved (what a bulk transfer through the sandbox
  costs on its link leg);
* **calls**: ``--calls`` small exchanges one after another, each on a stream of its own, as the daemons make them
  (``supervisor/link/rpc.py``): a unary call (JSON request, JSON reply) and an exec-shaped channel (the request
  object, the accept reply in a header, a few bytes of output, both ends closing); CPU per exchange. This is
  where the number of TLS records and system calls per exchange shows (a row counts the link's writes);
* **idle**: ``--idle`` streams opened and left waiting, as idle connections leave them; Python heap per stream
  (``tracemalloc``), both ends of the link together.

``--profile FILE`` writes a cProfile of the measured part (``python3 -m pstats FILE``).

    python3 bench/bench_link.py [--mb 256] [--runs 3] [--calls 2000] [--idle 2000] [--kind all|bulk|calls|idle]
                                [--json] [--quick] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import ssl
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trustme

from supervisor.link.h2link import Link, LinkStream
from supervisor.link.rpc import Router, call, open_channel
from supervisor.link.socket_tls import SocketTLSStream

CHUNK = 256 * 1024  # what the relay hands the link at once (supervisor/link/relay.py)


def _contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols(["h2"])
    return server, client


async def _tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    accepted: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    await listener.aclose()
    return accepted[0], client


async def _tls_pair() -> tuple[SocketTLSStream, SocketTLSStream]:
    """Both ends of a link's TLS over loopback TCP, handshake done."""
    server_ctx, client_ctx = _contexts()
    server_tcp, client_tcp = await _tcp_pair()
    server_tls = SocketTLSStream(server_tcp, server_ctx, server_side=True)
    client_tls = SocketTLSStream(client_tcp, client_ctx, server_side=False, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_tls.do_handshake)
        await client_tls.do_handshake()
    return server_tls, client_tls


async def transfer(total: int, upload: bool) -> float:
    """Move ``total`` bytes over a fresh link (client → server when ``upload``); return CPU seconds spent on the
    transfer alone (set-up excluded)."""
    server_tls, client_tls = await _tls_pair()
    payload = b"x" * CHUNK
    done = trio.Event()
    spent: list[float] = []

    async def sink_or_source(stream: LinkStream, send: bool) -> None:
        if send:
            left = total
            while left > 0:
                await stream.send_all(payload if left >= CHUNK else payload[:left])
                left -= CHUNK
            await stream.send_eof()
        else:
            got = 0
            while data := await stream.receive_some(CHUNK):
                got += len(data)
            if got != total:
                raise RuntimeError(f"received {got} of {total} bytes")
            spent.append(time.process_time())
            done.set()

    async def handler(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        await sink_or_source(stream, send=not upload)

    server = Link(server_tls, client=False, handler=handler, name="server")
    client = Link(client_tls, client=True, name="client")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await nursery.start(client.run)
        start = time.process_time()
        stream = await client.open_stream(
            [(":method", "POST"), (":scheme", "https"), (":authority", "bench"), (":path", "/")]
        )
        await stream.response()
        await sink_or_source(stream, send=upload)
        await done.wait()
        await stream.aclose()
        await client.aclose()
        await server.aclose()
    return spent[0] - start


EXEC_OUTPUT = b"\x01" + b"hello from the workload\n"  # a few bytes of output, as an exec's frames are


async def _unary(body: dict[str, Any]) -> dict[str, Any]:
    return {"state": "running", "agent": body.get("agent")}


async def _exec(body: dict[str, Any], stream: LinkStream, accept: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    await accept({"handle": "x_0123456789abcdef", "argv": body.get("argv")})
    await stream.send_all(EXEC_OUTPUT)


async def idle(count: int) -> float:
    """Python heap (``tracemalloc``) per stream held open and idle, both ends of one link together: the link's
    share of an idle connection's memory (a warm-up set is opened before the first snapshot)."""
    server_tls, client_tls = await _tls_pair()
    waiting = [trio.Event() for _ in range(50 + count)]  # one per stream, set once its handler waits (made
    # before the snapshots: they are the bench's, not the link's)

    async def handler(stream: LinkStream) -> None:
        await stream.send_headers([(":status", "200")])
        waiting[int(stream.stream_id) // 2].set()
        await stream.receive_some()  # an idle connection's stream: waiting for data that does not come

    server = Link(server_tls, client=False, handler=handler, name="server")
    client = Link(client_tls, client=True, name="client")
    request = [(":method", "POST"), (":scheme", "https"), (":authority", "bench"), (":path", "/")]
    held: list[LinkStream] = []

    async def open_idle(n: int) -> None:
        for _ in range(n):
            stream = await client.open_stream(request)
            await stream.response()
            held.append(stream)
        for event in waiting[: len(held)]:
            await event.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await nursery.start(client.run)
        await open_idle(50)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await open_idle(count)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        await client.aclose()
        await server.aclose()
    return grown / count


async def calls(count: int, kind: str) -> tuple[float, float]:
    """``count`` exchanges of ``kind`` (``unary`` or ``channel``) one after another over one link; return CPU
    seconds and transport writes (both ends together) per exchange, set-up and a warm-up excluded."""
    server_tls, client_tls = await _tls_pair()
    router = Router()
    router.unary_raw("/v1/status", _unary)
    router.channel_raw("/v1/exec", _exec)
    server = Link(server_tls, client=False, handler=router.handle, name="server")
    client = Link(client_tls, client=True, name="client")

    async def one() -> None:
        if kind == "unary":
            await call(client, "/v1/status", {"agent": "p_0123456789abcdef"})
            return
        stream, _reply = await open_channel(client, "/v1/exec", {"argv": ["true"], "stdin": "null"})
        got = b""
        while data := await stream.receive_some():
            got += data
        if got != EXEC_OUTPUT:
            raise RuntimeError(f"channel carried {got!r}")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await nursery.start(client.run)
        for _ in range(50):
            await one()
        start, writes = time.process_time(), client.writes + server.writes
        for _ in range(count):
            await one()
        spent, writes = time.process_time() - start, client.writes + server.writes - writes
        await client.aclose()
        await server.aclose()
    return spent / count, writes / count


def _row(name: str, unit: str, values: list[float], note: str) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "value": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": len(values),
        "note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="MiB per transfer (default 256; --quick 64)")
    parser.add_argument("--runs", type=int, default=3, help="rounds of each kind (default 3)")
    parser.add_argument(
        "--calls", type=int, default=2000, help="exchanges per round of calls (default 2000; --quick 500)"
    )
    parser.add_argument(
        "--idle", type=int, default=2000, help="streams held for the idle row (default 2000; --quick 500)"
    )
    parser.add_argument(
        "--kind", choices=("all", "bulk", "calls", "idle"), default="all", help="which rows (default all)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON row per line (bench/micro.py's shape)")
    parser.add_argument(
        "--quick", action="store_true", help="64 MiB transfers, 500 exchanges per round, 500 idle streams"
    )
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the measured runs to FILE")
    args = parser.parse_args()
    mb = 64 if args.quick and args.mb == 256 else args.mb
    count = 500 if args.quick and args.calls == 2000 else args.calls
    held = 500 if args.quick and args.idle == 2000 else args.idle
    total = mb * 1024 * 1024
    profiler = cProfile.Profile() if args.profile else None
    results: dict[str, list[float]] = {}  # insertion order: the rows' order
    for _ in range(args.runs):  # each kind alternated, so drift in the machine's load hits all alike
        jobs: list[tuple[str, Callable[[], float | tuple[float, float]]]] = []
        if args.kind in ("all", "bulk"):
            jobs += [
                ("up", lambda: trio.run(transfer, total, True) * 1000 / (total / 1e6)),
                ("down", lambda: trio.run(transfer, total, False) * 1000 / (total / 1e6)),
            ]
        if args.kind in ("all", "calls"):
            jobs += [
                ("unary", lambda: trio.run(calls, count, "unary")),
                ("channel", lambda: trio.run(calls, count, "channel")),
            ]
        if args.kind in ("all", "idle"):
            jobs.append(("idle", lambda: trio.run(idle, held)))
        for name, job in jobs:
            if profiler:
                profiler.enable()
            value = job()
            if profiler:
                profiler.disable()
            if isinstance(value, tuple):
                results.setdefault(name, []).append(value[0] * 1e6)
                results.setdefault(f"{name} writes", []).append(value[1])
            else:
                results.setdefault(name, []).append(value)
    if profiler and args.profile:
        profiler.dump_stats(args.profile)
    rows = []
    for name, values in results.items():
        if name in ("up", "down"):
            note = f"{mb} MiB per transfer, TLS 1.3 on the socket + HTTP/2, one stream"
            rows.append(_row(f"link CPU per MB ({name}, both ends)", "ms/MB", values, note))
        elif name == "idle":
            note = f"{held} streams held open and idle on one link, Python heap (tracemalloc)"
            rows.append(_row("link memory per idle stream (both ends)", "B", values, note))
        elif name.endswith(" writes"):
            note = "transport writes (TLS writes of the link's writer) per exchange"
            rows.append(_row(f"link writes per {name.split()[0]} exchange (both ends)", "writes", values, note))
        else:
            note = f"{count} exchanges one after another on one link, a stream each"
            rows.append(_row(f"link CPU per {name} exchange (both ends)", "us", values, note))
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['name']}: {row['value']} {row['unit']} (min {row['min']}, max {row['max']})")


if __name__ == "__main__":
    main()
