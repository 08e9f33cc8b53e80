"""What ``--log-format ocsf`` costs against ``json``: the daemon's CPU at the same event rate, same run, alternated.

    python3 bench/bench_event_format.py [--json] [--quick] [-n N] [--rounds R]

The busiest event source of the daemons is the inspected path: one ``http`` event per request. This runs
bench/bench_l7.py's origin (its own process) and clients (one process per connection), and in this process two
inspected listeners (``supervisor.control.l7.inspect``: TLS terminated, every request decided, its placeholder
resolved, one event each) that differ only in their log's format, each writing to ``/dev/null`` as a daemon writes
to its stdout. The same keep-alive workload runs on each listener in turn, ``--rounds`` times, alternating which
goes first; reported: this process's CPU (``time.process_time``) per request for each format, and their ratio
(the target: ``ocsf`` ≤ 1.10 × ``json``). A second part times the event builder alone (``JsonLog.emit`` of an
``http`` and an ``egress`` event) in both formats.

With ``--json`` every result is one JSON row ``{"name", "unit", "value", ...}`` (bench/micro.py's contract).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # import the repository, never bench/'s neighbours

import trio  # noqa: E402
import trustme  # noqa: E402

from bench.bench_l7 import HOST, POLICY, SECRET, client_main, origin_main  # noqa: E402
from supervisor.control.credentials import Credentials  # noqa: E402
from supervisor.control.l7 import InterceptionCA, Limits, inspect, upstream_context  # noqa: E402
from supervisor.control.policy import BinaryIdentity, L4Request, PolicyStore, compile_policy, load_policy_text  # noqa: E402
from supervisor.jsonlog import JsonLog, LogFormat  # noqa: E402
from supervisor.protocol.event_names import EventName  # noqa: E402

FORMATS = (LogFormat.JSON, LogFormat.OCSF)
IDENTITY = {"binary": "/usr/bin/curl", "binary_sha256": "ab" * 32, "ancestors": ["/usr/bin/bash", "/usr/bin/node"],
            "pid": 4242, "start_time": 123456, "conn_id": "c-1", "capture": "transparent"}  # fmt: skip


def _row(name: str, unit: str, value: float, **extra: float | int | str) -> dict[str, object]:
    return {"name": name, "unit": unit, "value": round(value, 4), **extra}


def _devnull() -> TextIO:
    """Where a daemon's stdout goes here: written to, as a pipe would be, and dropped (open for the whole run)."""
    return open("/dev/null", "w", encoding="utf-8")


async def _listeners(nursery: trio.Nursery, origin_port: int, origin_ca: str, ca: InterceptionCA) -> dict[str, int]:
    store = PolicyStore(compile_policy(load_policy_text(POLICY, "bench.yaml")), source="bench.yaml")
    snapshot = store.snapshot()
    l4 = snapshot.decide_l4(L4Request(HOST, 443, BinaryIdentity("/usr/bin/curl", None)))
    credentials = Credentials.from_mapping({"BENCH_TOKEN": {"secret": SECRET, "hosts": [HOST]}})
    upstream_ssl = upstream_context(extra_ca_pem=origin_ca, system_trust=False)

    async def dial() -> trio.abc.HalfCloseableStream:
        return await trio.open_tcp_stream("127.0.0.1", origin_port)

    async def serve(log: JsonLog, stream: trio.SocketStream) -> None:
        await inspect(stream, host=HOST, port=443, tls=None, snapshot=snapshot, l4=l4, connect_upstream=dial, ca=ca,
                      credentials=credentials, upstream_ssl=upstream_ssl, log=log, event_fields=dict(IDENTITY),
                      limits=Limits(idle_timeout=60))  # fmt: skip

    ports: dict[str, int] = {}
    for form in FORMATS:
        log = JsonLog("control", stream=_devnull(), sandbox="bench-sandbox", log_format=form)
        handler = functools.partial(serve, log)
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        ports[form] = listeners[0].socket.getsockname()[1]
    return ports


async def _cpu_per_request(pool: concurrent.futures.ProcessPoolExecutor, port: int, ca_pem: str, conns: int,
                           n: int) -> float:  # fmt: skip
    cpu0 = time.process_time()
    futures = [pool.submit(client_main, "keepalive", port, ca_pem, n, 0) for _ in range(conns)]
    for f in futures:
        await trio.to_thread.run_sync(f.result)
    return (time.process_time() - cpu0) / (n * conns) * 1e6


async def run_inspected(args: argparse.Namespace) -> list[dict[str, object]]:
    authority = trustme.CA()
    leaf = authority.issue_cert(HOST)
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Queue()
    origin = spawn.Process(target=origin_main, args=(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes(),
                                                     ready), daemon=True)  # fmt: skip
    origin.start()
    samples: dict[str, list[float]] = {form: [] for form in FORMATS}
    try:
        origin_port = await trio.to_thread.run_sync(ready.get, True, 30)
        ca = InterceptionCA.generate("bench")
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.conns, mp_context=spawn) as pool:
            async with trio.open_nursery() as nursery:
                ports = await _listeners(nursery, origin_port, authority.cert_pem.bytes().decode(), ca)
                for form in FORMATS:  # warm-up: pool start-up, leaf cache
                    await _cpu_per_request(pool, ports[form], ca.cert_pem, args.conns, 20)
                for r in range(args.rounds):
                    order = FORMATS if r % 2 == 0 else FORMATS[::-1]
                    for form in order:
                        samples[form].append(await _cpu_per_request(pool, ports[form], ca.cert_pem, args.conns, args.n))
                nursery.cancel_scope.cancel()
    finally:
        origin.kill()
        origin.join(5)
    requests = args.n * args.conns * args.rounds
    json_us, ocsf_us = statistics.median(samples[LogFormat.JSON]), statistics.median(samples[LogFormat.OCSF])
    return [
        _row("events json: inspected-path CPU per request (one http event each)", "us/req", json_us, runs=requests),
        _row("events ocsf: inspected-path CPU per request (one http event each)", "us/req", ocsf_us, runs=requests),
        _row(
            "events ocsf/json ratio: inspected-path CPU per request",
            "ratio",
            ocsf_us / json_us,
            runs=args.rounds,
            target=1.10,
        ),
    ]


def run_builder(count: int) -> list[dict[str, object]]:
    http = {**IDENTITY, "destination": "api.github.com:443", "tls": True, "policy_generation": 3, "method": "GET",
            "path": "/repos/x/y", "decision": "allow", "rule": "github", "endpoint": "api.github.com:443",
            "status": 200, "bytes_up": 0, "bytes_down": 5120, "injected": 1, "duration_ms": 3.2}  # fmt: skip
    egress = {**IDENTITY, "destination": "blocked.com:443", "decision": "deny", "reason": "no-matching-endpoint"}
    rows: list[dict[str, object]] = []
    with open("/dev/null", "w", encoding="utf-8") as sink:
        for name, fields in (("http", http), ("egress", egress)):
            cost: dict[str, float] = {}
            for form in FORMATS:
                log = JsonLog("control", stream=sink, sandbox="bench-sandbox", log_format=form)
                event = EventName.HTTP if name == "http" else EventName.EGRESS
                start = time.process_time()
                for _ in range(count):
                    log.emit(event, **fields)
                cost[form] = (time.process_time() - start) / count * 1e6
                rows.append(_row(f"events {form}: emit one {name} event", "us/event", cost[form], runs=count))
            rows.append(_row(f"events ocsf/json ratio: emit one {name} event", "ratio",
                             cost[LogFormat.OCSF] / cost[LogFormat.JSON]))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON row per result on stdout")
    parser.add_argument("--quick", action="store_true", help="small counts (CI smoke)")
    parser.add_argument("-n", type=int, default=None, help="requests per connection per round (default 1000)")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds per format (default 6)")
    parser.add_argument("--conns", type=int, default=2, help="parallel keep-alive connections")
    args = parser.parse_args()
    args.n = args.n or (100 if args.quick else 1000)
    args.rounds = args.rounds or (2 if args.quick else 6)
    rows: list[dict[str, Any]] = [*trio.run(run_inspected, args), *run_builder(2000 if args.quick else 20000)]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    for row in rows:
        extra = f"  (target <= {row['target']})" if "target" in row else ""
        print(f"{row['name']:<72} {row['value']:>10} {row['unit']}{extra}")


if __name__ == "__main__":
    main()
