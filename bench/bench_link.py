"""CPU per MB of the link as the daemons run it: claim-less mTLS on the socket plus HTTP/2 (supervisor/link), both
ends in this process over loopback TCP, one stream carrying the bulk one way.

What a bulk transfer through the sandbox costs on its link leg, measured as process CPU (``time.process_time``)
per MB moved, which a loaded machine distorts far less than wall time. ``--profile FILE`` writes a cProfile of
the transfers (``python3 -m pstats FILE``).

    python3 bench/bench_link.py [--mb 256] [--runs 3] [--json] [--quick] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import ssl
import statistics
import time

import trio
import trustme

from supervisor.link.h2link import Link, LinkStream
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


async def transfer(total: int, upload: bool) -> float:
    """Move ``total`` bytes over a fresh link (client → server when ``upload``); return CPU seconds spent on the
    transfer alone (set-up excluded)."""
    server_ctx, client_ctx = _contexts()
    server_tcp, client_tcp = await _tcp_pair()
    server_tls = SocketTLSStream(server_tcp, server_ctx, server_side=True)
    client_tls = SocketTLSStream(client_tcp, client_ctx, server_side=False, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_tls.do_handshake)
        await client_tls.do_handshake()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="MiB per transfer (default 256; --quick 64)")
    parser.add_argument("--runs", type=int, default=3, help="transfers per direction (default 3)")
    parser.add_argument("--json", action="store_true", help="one JSON row per direction (bench/micro.py's shape)")
    parser.add_argument("--quick", action="store_true", help="64 MiB transfers")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the transfers to FILE")
    args = parser.parse_args()
    mb = 64 if args.quick and args.mb == 256 else args.mb
    total = mb * 1024 * 1024
    profiler = cProfile.Profile() if args.profile else None
    results: dict[str, list[float]] = {"up": [], "down": []}
    for _ in range(args.runs):
        for direction in ("up", "down"):  # alternated, so drift in the machine's load hits both alike
            if profiler:
                profiler.enable()
            cpu = trio.run(transfer, total, direction == "up")
            if profiler:
                profiler.disable()
            results[direction].append(cpu * 1000 / (total / 1e6))
    if profiler and args.profile:
        profiler.dump_stats(args.profile)
    for direction, values in results.items():
        row = {
            "name": f"link CPU per MB ({direction}, both ends)",
            "unit": "ms/MB",
            "value": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
            "runs": len(values),
            "note": f"{mb} MiB per transfer, TLS 1.3 on the socket + HTTP/2, one stream",
        }
        print(
            json.dumps(row)
            if args.json
            else f"{row['name']}: {row['value']} ms/MB (min {row['min']}, max {row['max']})"
        )


if __name__ == "__main__":
    main()
