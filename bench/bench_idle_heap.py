"""Python heap per idle relayed connection, through the daemons' own relay and link, both in this process.

Each connection takes the path a tunnelled connection takes between the two daemons: an agent's TCP socket,
relayed by ``supervisor.link.relay.relay`` (the boundary's side) onto a stream of a claim-less mTLS + HTTP/2 link
(``supervisor.link.h2link``), whose server end hands the stream to a second ``relay`` (control's side) onto an
upstream TCP socket. ``--count`` such connections are opened (each proven by one echo) and left idle; the heap
they grew (``tracemalloc``, after a warm-up set and ``gc.collect``) is divided by their number.

The total includes the bench's own ends (the agent's and the upstream's sockets and their tasks); what the two
relay sides hold is read from the allocation sites, grouped by the nearest frame in ``supervisor/`` (or else the
first frame of the traceback), printed largest first. A busy machine does not distort these numbers: they count
bytes, not time.

    python3 bench/bench_idle_heap.py [--count 1000] [--runs 3] [--top 15] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tracemalloc
from collections import Counter
from typing import Any

import trio

from bench.bench_link import _tls_pair
from supervisor.link.h2link import Link, LinkStream
from supervisor.link.relay import relay

IDLE_TIMEOUT_S = 3600.0  # nothing times out while the snapshot is taken
WARM_UP = 50
PING = b"ping"


def _site(trace: tracemalloc.Traceback) -> str:
    """The allocation's nearest frame in the project, else its innermost one: what a reader can act on."""
    for frame in reversed(trace):  # most recent call last
        if "/supervisor/" in frame.filename:
            return f"{frame.filename.split('/supervisor/', 1)[1]}:{frame.lineno}"
    frame = trace[-1]
    return f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}"


async def run(count: int) -> tuple[float, Counter[str]]:
    """Open ``count`` relayed connections, leave them idle; return heap bytes per connection and bytes by site."""
    server_tls, client_tls = await _tls_pair()
    upstream_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    agent_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    upstream_port = upstream_listener.socket.getsockname()[1]
    agent_port = agent_listener.socket.getsockname()[1]

    async def control_side(stream: LinkStream) -> None:
        # control's share: the link stream relayed onto an upstream socket
        upstream = await trio.open_tcp_stream("127.0.0.1", upstream_port)
        await stream.send_headers([(":status", "200")])
        await relay(stream, upstream, idle_timeout=IDLE_TIMEOUT_S)

    server = Link(server_tls, client=False, handler=control_side, name="control")
    client = Link(client_tls, client=True, name="boundary")
    request = [(":method", "POST"), (":scheme", "https"), (":authority", "bench"), (":path", "/")]

    async def boundary_side(agent: trio.SocketStream) -> None:
        # the boundary's share: a captured socket relayed onto a new link stream
        stream = await client.open_stream(request)
        await stream.response()
        await relay(agent, stream, idle_timeout=IDLE_TIMEOUT_S)

    async def echo(upstream: trio.SocketStream) -> None:
        while data := await upstream.receive_some():
            await upstream.send_all(data)

    held: list[trio.SocketStream] = []

    async def open_idle(n: int) -> None:
        for _ in range(n):
            agent = await trio.open_tcp_stream("127.0.0.1", agent_port)
            await agent.send_all(PING)
            got = b""
            while len(got) < len(PING):
                got += await agent.receive_some()
            held.append(agent)

    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await nursery.start(client.run)
        nursery.start_soon(trio.serve_listeners, echo, [upstream_listener])
        nursery.start_soon(trio.serve_listeners, boundary_side, [agent_listener])
        await open_idle(WARM_UP)
        await trio.sleep(0.2)
        gc.collect()
        tracemalloc.start(25)
        try:
            before = tracemalloc.take_snapshot()
            await open_idle(count)
            await trio.sleep(0.2)  # every relay is waiting again after its echo
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        sites: Counter[str] = Counter()
        for stat in after.compare_to(before, "traceback"):
            sites[_site(stat.traceback)] += stat.size_diff
        nursery.cancel_scope.cancel()
    return grown / count, sites


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="idle connections held (default 1000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds; the median is reported (default 3)")
    parser.add_argument("--top", type=int, default=15, help="allocation sites listed (default 15)")
    parser.add_argument("--json", action="store_true", help="one JSON row (bench/micro.py's shape)")
    args = parser.parse_args()
    values: list[float] = []
    sites: Counter[str] = Counter()
    for _ in range(args.runs):
        value, by_site = trio.run(run, args.count)
        values.append(value)
        sites = by_site  # the last round's sites: they differ between rounds by noise only
    row: dict[str, Any] = {
        "name": "heap per idle relayed connection (both relay sides, the link, the bench's sockets)",
        "unit": "B",
        "value": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "runs": len(values),
        "note": f"{args.count} connections held idle, Python heap (tracemalloc)",
    }
    if args.json:
        print(json.dumps(row))
        return
    print(f"{row['name']}: {row['value']} B (min {row['min']}, max {row['max']}, {row['runs']} runs)")
    for site, size in sites.most_common(args.top):
        print(f"  {size / args.count:8.1f} B  {site}")


if __name__ == "__main__":
    main()
