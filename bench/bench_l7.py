"""Intercepted HTTPS (L7 inspection, and TLS termination without rules) against a raw relayed tunnel
(``tls: skip``), in the same run, on loopback only.

    python3 bench/bench_l7.py [--json] [--quick] [-n N] [--mib M] [--conns C]

Three processes, as in a deployment: an HTTPS origin (stdlib ``http.server`` over ``ssl``, threads, trustme
certificate), the mediator under test (this process, trio), and the client (stdlib ``http.client`` over
``ssl``, one process per connection). The mediator runs two listeners side by side:

* ``tunnel``: each accepted connection is relayed byte for byte to the origin (``supervisor.link.relay``);
  the client's TLS goes end to end to the origin — what an un-inspected CONNECT costs;
* ``intercepted``: each accepted connection goes through ``supervisor.control.l7.inspect``: TLS terminated
  with a leaf from the sandbox CA, every request parsed by h11, judged by ``decide_l7`` (a REST rule set),
  its ``Authorization: Bearer <placeholder>`` replaced by the secret, sent over a verified TLS connection to
  the origin, one JSON event per request (written to /dev/null);
* ``terminated``: the default for an endpoint without L7 rules: dialled first, the first bytes
  sniffed, TLS terminated, every request's authority bound to the tunnel and its placeholder resolved — no
  rules to judge. ``tunnel`` is what a ``tls: skip`` endpoint costs;
* ``mcp``: a ``protocol: mcp`` endpoint (two tools allowed): each POST's body read whole, parsed as JSON-RPC, its
  ``tools/call`` judged by method and tool, then forwarded as read.

* ``inference``: control's ``inference.local`` router (``supervisor.control.inference``): TLS terminated with the
  sandbox CA, the request's shape and model checked, the caller's key dropped and the route's injected, the
  backend dialled as any upstream (vetted, TLS verified), its SSE stream scrubbed of the key on the way back.

Workloads, each on both listeners, one after the other: small GETs on kept-alive connections (1 and
``--conns`` in parallel), small GETs on a fresh connection each (TLS handshakes: two for intercepted, one
for tunnel), one large download and one large upload; and an MCP ``tools/call`` POSTed on a kept-alive connection,
on ``mcp`` and ``tunnel`` only; a streamed chat completion (SSE, one token per event, ``--tokens`` per answer)
through ``inference`` and straight to the same backend (``direct``). The model backend is the tests' one
(tests/inference_backend.py) on a test host in a network namespace of its own (tests/netns_hosts.py; root
only): the router, like control, never dials loopback. Reported: requests/s, MB/s, tokens/s and the time to the
first token, the mediator's CPU per request, per MB or per token (``time.process_time`` of this process), and
intercepted/tunnel and inference/direct ratios. The HTTP workloads run in ``REPEATS`` passes with every listener in
each: a rate is the median over the passes, a ratio the median of the passes' own ratios, a CPU figure the total
over the passes.

With ``--json`` every result is one JSON row ``{"name", "unit", "value", ...}`` (bench/micro.py's contract).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import http.client
import http.server
import io
import json
import multiprocessing
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # import the repository, never bench/'s neighbours

import trio  # noqa: E402
import trustme  # noqa: E402

from supervisor.control.connection_result import ConnectionResult  # noqa: E402
from supervisor.control.credentials import Credentials  # noqa: E402
from supervisor.control.inference.router import InferenceRouter  # noqa: E402
from supervisor.control.inference.routes import load_routes_text  # noqa: E402
from supervisor.control.inference.store import RoutesStore  # noqa: E402
from supervisor.control.l7 import InterceptionCA, Limits, inspect, upstream_context  # noqa: E402
from supervisor.control.policy import (  # noqa: E402
    BinaryIdentity,
    L4Request,
    PolicyStore,
    compile_policy,
    load_policy_text,
)
from supervisor.control.upstream import UpstreamConfig  # noqa: E402
from supervisor.jsonlog import JsonLog  # noqa: E402
from supervisor.link.relay import relay  # noqa: E402
from supervisor.protocol.egress import CaptureKind, EgressRequest  # noqa: E402
from tests.netns_hosts import NetnsHost, open_upstream_host, unavailable_reason  # noqa: E402

HOST = "bench.test"
PLACEHOLDER = "openshell:resolve:env:BENCH_TOKEN"
SECRET = "bench-secret-0123456789abcdef"
SMALL = b'{"ok":true,"items":[1,2,3,4,5,6,7,8,9,10]}' * 3
POLICY = f"""
version: 1
network_policies:
  bench:
    endpoints:
      - host: {HOST}
        port: 443
        protocol: rest
        enforcement: enforce
        rules:
          - allow: {{method: GET, path: "/**"}}
          - allow: {{method: POST, path: "/upload"}}
        deny_rules:
          - {{method: GET, path: "/admin/**"}}
    binaries: [{{path: /usr/bin/curl}}]
"""
# The policy of the "terminated" mode: the same host with no L7 rules (TLS still terminated, authority bound).
PLAIN_POLICY = f"""
version: 1
network_policies:
  bench:
    endpoints:
      - host: {HOST}
        port: 443
    binaries: [{{path: /usr/bin/curl}}]
"""
# The policy of the "mcp" mode: an MCP server with two of its tools.
MCP_POLICY = f"""
version: 1
network_policies:
  bench:
    endpoints:
      - host: {HOST}
        port: 443
        path: /mcp
        protocol: mcp
        enforcement: enforce
        mcp: {{allow_all_known_mcp_methods: true}}
        rules:
          - allow: {{tool: {{any: [get_forecast, get_alerts]}}}}
    binaries: [{{path: /usr/bin/curl}}]
"""
MCP_ARGUMENTS = {"city": "Lyon", "days": 3}
MCP_CALL = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "get_forecast", "arguments": MCP_ARGUMENTS}}).encode()  # fmt: skip
MCP_RESULT = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "sunny"}],
                                                              "isError": False}}).encode()  # fmt: skip
# The inference row: the tests' model backend on a test host, one route to it.
MODEL_KEY = "sk-bench-model-key-7d1e5a90c3"
MODEL_PORT = 8443
BACKEND = Path(__file__).resolve().parent.parent / "tests" / "inference_backend.py"
ROUTES = """\
version: 1
routes:
  bench:
    kind: openai
    base_url: https://{address}:{port}/v1
    credential: MODEL_KEY
    models: [count]
    allowed_ips: ["{address}/32"]
"""
MODES = ("tunnel", "intercepted", "terminated")
INTERCEPTING = ("intercepted", "terminated")


# --- the origin (its own process) -----------------------------------------------------------------------------


class _OriginHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms Nagle/delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            while size:
                n = min(size, len(chunk))
                self.wfile.write(chunk[:n])
                size -= n
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(SMALL)))
        self.end_headers()
        self.wfile.write(SMALL)

    def do_POST(self) -> None:
        left = int(self.headers.get("Content-Length", "0"))
        while left:
            data = self.rfile.read(min(left, 1 << 20))
            if not data:
                break
            left -= len(data)
        answer = MCP_RESULT if self.path == "/mcp" else b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def origin_main(cert_pem: bytes, key_pem: bytes, ready: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.num_tickets = 0  # the handshake runs before the handler can disable Nagle: no trailing ticket writes
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OriginHandler)
        server.daemon_threads = True
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        ready.put(server.server_address[1])
        server.serve_forever()


# --- the client (its own process per connection) ----------------------------------------------------------------


def _connect(port: int, ctx: ssl.SSLContext) -> http.client.HTTPSConnection:
    conn = http.client.HTTPSConnection(HOST, 443, context=ctx)  # no per-connection default context
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sock = ctx.wrap_socket(sock, server_hostname=HOST)
    return conn


def client_main(workload: str, port: int, ca_pem: str, count: int, size: int) -> tuple[float, int]:
    """Run one workload; returns (seconds, bytes moved)."""
    ctx = ssl.create_default_context(cadata=ca_pem)
    headers = {"Authorization": f"Bearer {PLACEHOLDER}"}
    moved = 0
    start = time.perf_counter()
    if workload == "keepalive":
        conn = _connect(port, ctx)
        for _ in range(count):
            conn.request("GET", "/v1/items?page=1", headers=headers)
            moved += len(conn.getresponse().read())
        conn.close()
    elif workload == "mcp":
        conn = _connect(port, ctx)
        mcp_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                       "Mcp-Session-Id": "bench-session"}  # fmt: skip
        for _ in range(count):
            conn.request("POST", "/mcp", body=MCP_CALL, headers=mcp_headers)
            moved += len(conn.getresponse().read())
        conn.close()
    elif workload == "fresh":
        for _ in range(count):
            conn = _connect(port, ctx)
            conn.request("GET", "/v1/items", headers=headers)
            moved += len(conn.getresponse().read())
            conn.close()
    elif workload == "download":
        conn = _connect(port, ctx)
        conn.request("GET", f"/big/{size}", headers=headers)
        response = conn.getresponse()
        while chunk := response.read(1 << 20):
            moved += len(chunk)
        conn.close()
    elif workload == "upload":
        conn = _connect(port, ctx)
        conn.putrequest("POST", "/upload")
        conn.putheader("Authorization", f"Bearer {PLACEHOLDER}")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        chunk = b"u" * (1 << 20)
        left = size
        assert conn.sock is not None
        while left:
            n = min(left, len(chunk))
            conn.sock.sendall(chunk[:n])
            left -= n
        conn.getresponse().read()
        moved = size
        conn.close()
    else:
        raise ValueError(workload)
    return time.perf_counter() - start, moved


def sse_client_main(address: str, port: int, server_name: str, ca_pem: str, count: int, tokens: int,
                    key: str) -> tuple[float, int, float]:  # fmt: skip
    """``count`` streamed chat completions of ``tokens`` one-token SSE events, one connection each (the backend
    ends a stream by closing); returns (seconds, tokens read, summed seconds to the first token)."""
    ctx = ssl.create_default_context(cadata=ca_pem)
    body = json.dumps({"model": "count", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "count"}]}).encode()  # fmt: skip
    got, first = 0, 0.0
    start = time.perf_counter()
    for _ in range(count):
        sock = socket.create_connection((address, port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # the authority the agent names: inference.local (on 443, whichever port the bench listens on)
        conn = http.client.HTTPSConnection(server_name, 443 if server_name == "inference.local" else port, context=ctx)
        conn.sock = ctx.wrap_socket(sock, server_hostname=server_name)
        sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200, (response.status, response.read()[:300])
        seen = 0
        while line := response.readline():
            if line.startswith(b"data: {"):
                seen += 1
                if seen == 1:
                    first += time.perf_counter() - sent
        assert seen == tokens, (seen, tokens)
        got += seen
        conn.close()
    return time.perf_counter() - start, got, first


# --- the model backend (a test host of its own: the router never dials loopback) ------------------------------


@dataclass
class ModelBackend:
    host: NetnsHost
    ca_pem: str
    tmp: tempfile.TemporaryDirectory[str]

    @classmethod
    def start(cls) -> ModelBackend:
        host = open_upstream_host()
        tmp = tempfile.TemporaryDirectory(prefix="bench-model-")
        try:
            authority = trustme.CA()
            leaf = authority.issue_cert(host.address)
            cert, key = Path(tmp.name, "cert.pem"), Path(tmp.name, "key.pem")
            cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
            key.write_bytes(leaf.private_key_pem.bytes())
            host.popen([sys.executable, str(BACKEND), host.address, str(MODEL_PORT), str(cert), str(key),
                        str(Path(tmp.name, "requests.jsonl")), MODEL_KEY])  # fmt: skip
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection((host.address, MODEL_PORT), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            return cls(host, authority.cert_pem.bytes().decode(), tmp)
        except BaseException:
            host.close()
            tmp.cleanup()
            raise

    def close(self) -> None:
        self.host.close()
        self.tmp.cleanup()


# --- the mediator (this process) ---------------------------------------------------------------------------------


class _LinkSide(trio.abc.HalfCloseableStream):
    """What the router is handed on a link (the agent's CONNECT stream): here the client's TCP connection, the
    reply head dropped."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.transport_stream = inner

    async def send_headers(self, headers: Any, *, end_stream: bool = False, now: bool = False) -> None:
        await trio.lowlevel.checkpoint()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.transport_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.transport_stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return bytes(await self.transport_stream.receive_some(max_bytes))

    async def aclose(self) -> None:
        await self.transport_stream.aclose()


class _Discard(io.StringIO):
    def write(self, text: str) -> int:
        return len(text)


@dataclass
class Mediator:
    origin_port: int
    origin_ca_pem: str
    ca: InterceptionCA
    ports: dict[str, int]
    model: ModelBackend | None = None

    async def serve(self, nursery: trio.Nursery) -> None:
        store = PolicyStore(compile_policy(load_policy_text(POLICY, "bench.yaml")), source="bench.yaml")
        snapshot = store.snapshot()
        l4 = snapshot.decide_l4(L4Request(HOST, 443, BinaryIdentity("/usr/bin/curl", None)))
        credentials = Credentials.from_mapping({"BENCH_TOKEN": {"secret": SECRET, "hosts": [HOST]}})
        upstream_ssl = upstream_context(extra_ca_pem=self.origin_ca_pem, system_trust=False)
        log = JsonLog("control", stream=_Discard())  # events are rendered (that is part of the cost), then dropped

        async def dial() -> trio.abc.HalfCloseableStream:
            return await trio.open_tcp_stream("127.0.0.1", self.origin_port)

        async def tunnel(stream: trio.SocketStream) -> None:
            await relay(stream, await dial(), idle_timeout=60)

        async def intercepted(stream: trio.SocketStream) -> None:
            await inspect(stream, host=HOST, port=443, tls=None, snapshot=snapshot, l4=l4, connect_upstream=dial,
                          ca=self.ca, credentials=credentials, upstream_ssl=upstream_ssl, log=log,
                          event_fields={"conn_id": "bench"}, limits=Limits(idle_timeout=60))  # fmt: skip

        plain = PolicyStore(compile_policy(load_policy_text(PLAIN_POLICY, "plain.yaml")), source="plain.yaml")
        plain_snapshot = plain.snapshot()
        plain_l4 = plain_snapshot.decide_l4(L4Request(HOST, 443, BinaryIdentity("/usr/bin/curl", None)))

        async def terminated(stream: trio.SocketStream) -> None:
            # control's path for an endpoint without L7 rules: dialled first, then sniffed (raw_fallback)
            await inspect(stream, host=HOST, port=443, tls=None, snapshot=plain_snapshot, l4=plain_l4,
                          connect_upstream=dial, ca=self.ca, credentials=credentials, upstream_ssl=upstream_ssl,
                          log=log, event_fields={"conn_id": "bench"}, limits=Limits(idle_timeout=60),
                          raw_fallback=True, early_upstream=await dial())  # fmt: skip

        mcp_store = PolicyStore(compile_policy(load_policy_text(MCP_POLICY, "mcp.yaml")), source="mcp.yaml")
        mcp_snapshot = mcp_store.snapshot()
        mcp_l4 = mcp_snapshot.decide_l4(L4Request(HOST, 443, BinaryIdentity("/usr/bin/curl", None)))

        async def mcp(stream: trio.SocketStream) -> None:
            await inspect(stream, host=HOST, port=443, tls=None, snapshot=mcp_snapshot, l4=mcp_l4,
                          connect_upstream=dial, ca=self.ca, credentials=credentials, upstream_ssl=upstream_ssl,
                          log=log, event_fields={"conn_id": "bench"}, limits=Limits(idle_timeout=60))  # fmt: skip

        handlers = {"tunnel": tunnel, "intercepted": intercepted, "terminated": terminated, "mcp": mcp}
        if self.model is not None:
            routes = load_routes_text(ROUTES.format(address=self.model.host.address, port=MODEL_PORT), "routes.yaml")
            model_key = Credentials.from_mapping({"MODEL_KEY": {"secret": MODEL_KEY, "hosts": []}})
            router = InferenceRouter(RoutesStore(routes, model_key, log), credentials=model_key, ca=self.ca,
                                     upstream_ssl=upstream_context(extra_ca_pem=self.model.ca_pem, system_trust=False),
                                     upstream=UpstreamConfig(), log=log)  # fmt: skip
            counters = {"allowed": 0, "denied": 0, "failed": 0}

            async def inference(stream: trio.SocketStream) -> None:
                # as control's egress service hands it a CONNECT inference.local:443 (no process identity here)
                request = EgressRequest("inference.local", 443, CaptureKind.CONNECT, None, "bench", 1)
                with ConnectionResult(log, counters, request) as result:
                    await router.serve(_LinkSide(stream), request, result)  # type: ignore[arg-type]

            handlers["inference"] = inference
        for mode, handler in handlers.items():
            listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            self.ports[mode] = listeners[0].socket.getsockname()[1]


# Passes of each workload, every mode in each: one transfer of a few MiB is over in tens of milliseconds, and a
# single pass let the download row's ratio swing between 0.2x and 0.8x from run to run on the same tree.
REPEATS = 3


def _row(name: str, unit: str, value: float, **extra: float | int | str) -> dict[str, object]:
    return {"name": name, "unit": unit, "value": round(value, 4), **extra}


async def _measure(pool: concurrent.futures.ProcessPoolExecutor, parallel: int, workload: str, port: int,
                   ca_pem: str, count: int, size: int) -> tuple[float, int, float]:  # fmt: skip
    """(wall seconds, bytes, mediator CPU seconds) for ``parallel`` clients running ``workload`` at once."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    futures = [pool.submit(client_main, workload, port, ca_pem, count, size) for _ in range(parallel)]
    results = [await trio.to_thread.run_sync(f.result) for f in futures]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return max(wall, max(r[0] for r in results)), sum(r[1] for r in results), cpu


async def _inference_rows(pool: concurrent.futures.ProcessPoolExecutor, mediator: Mediator,
                          args: argparse.Namespace) -> list[dict[str, object]]:  # fmt: skip
    """Streamed chat completions through ``inference.local`` and straight to the backend, in the same run."""
    assert mediator.model is not None
    backend = (mediator.model.host.address, MODEL_PORT, mediator.model.host.address, mediator.model.ca_pem, MODEL_KEY)
    targets = {"direct": backend,
               "inference": ("127.0.0.1", mediator.ports["inference"], "inference.local", mediator.ca.cert_pem,
                             "dummy-agent-key")}  # fmt: skip
    rows: list[dict[str, object]] = []
    values: dict[str, float] = {}
    title = f"streamed chat completion tokens/s (SSE, {args.tokens} tokens per answer, 1 connection each)"
    for mode, (address, port, name, ca_pem, key) in targets.items():
        await trio.to_thread.run_sync(pool.submit(sse_client_main, address, port, name, ca_pem, 1, 16, key).result)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        future = pool.submit(sse_client_main, address, port, name, ca_pem, args.answers, args.tokens, key)
        seconds, tokens, first = await trio.to_thread.run_sync(future.result)
        wall, cpu = max(time.perf_counter() - wall0, seconds), time.process_time() - cpu0
        values[mode] = tokens / wall
        rows.append(_row(f"l7 {mode}: {title}", "tokens/s", values[mode], runs=args.answers))
        rows.append(_row(f"l7 {mode}: time to the first token", "ms", first / args.answers * 1e3, runs=args.answers))
        if mode == "inference":
            rows.append(_row(f"l7 {mode}: mediator CPU (per streamed token)", "us/token", cpu / tokens * 1e6,
                             runs=args.answers))  # fmt: skip
    rows.append(_row(f"l7 inference/direct ratio: {title}", "ratio", values["inference"] / values["direct"]))
    return rows


async def run(args: argparse.Namespace) -> list[dict[str, object]]:
    authority = trustme.CA()
    leaf = authority.issue_cert(HOST)
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Queue()
    origin = spawn.Process(target=origin_main, args=(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes(),
                                                     ready), daemon=True)  # fmt: skip
    origin.start()
    rows: list[dict[str, object]] = []
    model = None
    if args.inference:
        if reason := unavailable_reason():
            print(f"bench_l7: no inference row: the model backend needs a test host ({reason})", file=sys.stderr)
        else:
            model = ModelBackend.start()
    try:
        origin_port = await trio.to_thread.run_sync(ready.get, True, 30)
        origin_ca = authority.cert_pem.bytes().decode()
        mediator = Mediator(origin_port, origin_ca, InterceptionCA.generate("bench"), {}, model)
        ca_for = {"tunnel": origin_ca, "intercepted": mediator.ca.cert_pem, "terminated": mediator.ca.cert_pem,
                  "mcp": mediator.ca.cert_pem}  # fmt: skip
        size = args.mib << 20
        plan: list[tuple[str, str, int, int, int, str, Callable[[float, int, int], float], str]] = [
            ("keep-alive GET requests/s, 1 connection", "keepalive", 1, args.n, 0, "req/s",
             lambda wall, _b, n: n / wall, "us/req"),
            (f"keep-alive GET requests/s, {args.conns} connections", "keepalive", args.conns, args.n, 0, "req/s",
             lambda wall, _b, n: n / wall, "us/req"),
            ("new-connection GET requests/s (TLS handshake each)", "fresh", 1, max(args.n // 10, 20), 0, "req/s",
             lambda wall, _b, n: n / wall, "us/req"),
            (f"download MB/s ({args.mib} MiB, 1 connection)", "download", 1, 1, size, "MB/s",
             lambda wall, moved, _n: moved / wall / 1e6, "us/MB"),
            (f"upload MB/s ({args.mib} MiB, 1 connection)", "upload", 1, 1, size, "MB/s",
             lambda wall, moved, _n: moved / wall / 1e6, "us/MB"),
        ]  # fmt: skip
        with concurrent.futures.ProcessPoolExecutor(max_workers=max(args.conns, 1), mp_context=spawn) as pool:
            # warm the pool (spawn start-up) and the leaf cache outside the measurements
            async with trio.open_nursery() as nursery:
                await mediator.serve(nursery)
                if not args.inference_only:
                    for mode in MODES:
                        await _measure(pool, args.conns, "keepalive", mediator.ports[mode], ca_for[mode], 5, 0)
                    for title, workload, parallel, count, nbytes, unit, rate, cpu_unit in plan:
                        # REPEATS passes, every mode in each: a value is the median over the passes and a ratio the
                        # median of the passes' own ratios (the tunnel's rate swings between passes by itself)
                        rates: dict[str, list[float]] = {mode: [] for mode in MODES}
                        cpus = dict.fromkeys(MODES, 0.0)
                        moves = dict.fromkeys(MODES, 0)
                        for _ in range(REPEATS):
                            for mode in MODES:
                                wall, moved, cpu = await _measure(pool, parallel, workload, mediator.ports[mode],
                                                                  ca_for[mode], count, nbytes)  # fmt: skip
                                rates[mode].append(rate(wall, moved, count * parallel))
                                cpus[mode] += cpu
                                moves[mode] += moved
                        total = count * parallel * REPEATS
                        for mode in MODES:
                            per = cpus[mode] / (total if unit == "req/s" else moves[mode] / 1e6) * 1e6
                            rows.append(_row(f"l7 {mode}: {title}", unit, statistics.median(rates[mode]), runs=total))
                            rows.append(_row(f"l7 {mode}: mediator CPU ({title.split(' ')[0]})", cpu_unit, per,
                                             runs=total))  # fmt: skip
                        for mode in INTERCEPTING:
                            ratios = [own / tunnel for own, tunnel in zip(rates[mode], rates["tunnel"], strict=True)]
                            rows.append(_row(f"l7 {mode}/tunnel ratio: {title}", "ratio", statistics.median(ratios),
                                             runs=REPEATS))  # fmt: skip
                    # the agent's own protocols: one MCP tools/call after another on a kept-alive connection
                    title = "keep-alive MCP tools/call requests/s, 1 connection"
                    values: dict[str, float] = {}
                    await _measure(pool, 1, "mcp", mediator.ports["mcp"], ca_for["mcp"], 5, 0)
                    for mode in ("tunnel", "mcp"):
                        wall, _moved, cpu = await _measure(
                            pool, 1, "mcp", mediator.ports[mode], ca_for[mode], args.n, 0
                        )
                        values[mode] = args.n / wall
                        rows.append(_row(f"l7 {mode}: {title}", "req/s", values[mode], runs=args.n))
                        rows.append(_row(f"l7 {mode}: mediator CPU (MCP tools/call)", "us/req", cpu / args.n * 1e6,
                                         runs=args.n))  # fmt: skip
                    rows.append(_row(f"l7 mcp/tunnel ratio: {title}", "ratio", values["mcp"] / values["tunnel"]))
                if model is not None:
                    rows += await _inference_rows(pool, mediator, args)
                nursery.cancel_scope.cancel()
    finally:
        origin.kill()
        origin.join(5)
        if model is not None:
            model.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON row per result on stdout")
    parser.add_argument("--quick", action="store_true", help="small counts and sizes (CI smoke)")
    parser.add_argument("-n", type=int, default=None, help="requests per connection (default 2000; quick 200)")
    parser.add_argument("--mib", type=int, default=None, help="transfer size in MiB (default 256; quick 16)")
    parser.add_argument("--conns", type=int, default=4, help="parallel connections for the keep-alive run")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per streamed answer (default 2000; "
                        "quick 500)")  # fmt: skip
    parser.add_argument("--answers", type=int, default=None, help="streamed answers per mode (default 20; quick 4)")
    parser.add_argument("--no-inference", dest="inference", action="store_false",
                        help="leave out the inference row (it needs root for its test host)")  # fmt: skip
    parser.add_argument("--inference-only", action="store_true", help="only the inference row")
    args = parser.parse_args()
    args.n = args.n or (200 if args.quick else 2000)
    args.mib = args.mib or (16 if args.quick else 256)
    args.tokens = args.tokens or (500 if args.quick else 2000)
    args.answers = args.answers or (4 if args.quick else 20)
    rows = trio.run(run, args)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    out = io.StringIO()
    for row in rows:
        out.write(f"{row['name']:<92} {row['value']:>12} {row['unit']}\n")
    sys.stdout.write(out.getvalue())


if __name__ == "__main__":
    threading.current_thread().name = "bench_l7"
    main()
