"""Claim-bound mTLS handshakes per second on loopback (ECDSA P-256, TLS 1.3, verify_peer on both sides).

    python3 bench/bench_handshake.py [--json] [--quick] [-n N]

Three measurements, one after the other, each a sequence of full handshakes (no resumption: the server
sends no tickets) on 127.0.0.1, every one followed by ``verify_peer`` on both sides and one byte each way:

* ``trio``: both sides in one process through ``trio.SSLStream``, as the daemons do; the rate is bounded by
  one core doing both sides' work, so its inverse is the CPU cost of a handshake pair.
* ``stdlib``: blocking ``ssl`` sockets, the server in a forked process, so the two sides run on two cores;
  each side's CPU per handshake is reported separately (the boundary pays the server's share).
* ``verify_peer``: the post-handshake check alone, for a certificate seen before (its CA signature check and
  claims parse are cached) and one seen for the first time.

With ``--json`` every result is one JSON row on stdout (bench/micro.py's contract); otherwise a short table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # import the repository, never bench/'s neighbours

import trio  # noqa: E402

from supervisor.protocol import tls  # noqa: E402
from supervisor.protocol.certs import Bundle, issue_bundle, load_bundle  # noqa: E402
from supervisor.protocol.claims import Claims, Role  # noqa: E402
from supervisor.protocol.tls import ALPN_OPS, client_context, server_context, verify_peer  # noqa: E402

CLAIMS = Claims(
    namespace="bench",
    sandbox="handshake",
    sandbox_uid="00000000-0000-4000-8000-000000000000",
    control_deployment="os-ctl-handshake-0000",
    network_policy="os-np-handshake-0000",
    image="registry.example/agent@sha256:" + "0" * 64,
    generation=1,
    policy_resource="ConfigMap/handshake@0",
)


def _cpu() -> float:
    return time.process_time()  # this process's user + system CPU, nanosecond clock


def _row(name: str, unit: str, value: float, **extra: float | int | str) -> dict[str, object]:
    return {"name": name, "unit": unit, "value": round(value, 4), **extra}


def _latency_rows(label: str, samples: list[float]) -> list[dict[str, object]]:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return [
        _row(
            f"mTLS handshake latency ({label})",
            "ms",
            statistics.median(ms),
            p50=round(statistics.median(ms), 4),
            p99=round(p99, 4),
            min=round(ms[0], 4),
            max=round(ms[-1], 4),
            runs=len(ms),
        )
    ]


# --- trio, both sides in one process ------------------------------------------------------------------------


async def _trio_run(control: Bundle, boundary: Bundle, n: int) -> tuple[float, float, list[float]]:
    sctx, cctx = server_context(boundary), client_context(control, [ALPN_OPS])
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    samples: list[float] = []

    async def serve_one() -> None:
        stream = trio.SSLStream(await listeners[0].accept(), sctx, server_side=True)
        await stream.do_handshake()
        verify_peer(stream, boundary, expected_alpn=ALPN_OPS)
        await stream.send_all(b"!")
        await stream.receive_some(1)
        await trio.aclose_forcefully(stream)

    async def dial_one() -> None:
        stream = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), cctx)
        await stream.do_handshake()
        verify_peer(stream, control, expected_alpn=ALPN_OPS)
        await stream.receive_some(1)
        await stream.send_all(b"!")
        await trio.aclose_forcefully(stream)

    cpu0, wall0 = _cpu(), time.perf_counter()
    for _ in range(n):
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_one)
            nursery.start_soon(dial_one)
        samples.append(time.perf_counter() - start)
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    await listeners[0].aclose()
    return wall, cpu, samples


def bench_trio(control: Bundle, boundary: Bundle, n: int) -> list[dict[str, object]]:
    wall, cpu, samples = trio.run(_trio_run, control, boundary, n)
    return [
        _row("mTLS handshakes/s (trio.SSLStream, both sides on one core)", "handshakes/s", n / wall, runs=n),
        _row("mTLS handshake CPU, both sides (trio)", "ms", cpu / n * 1000, runs=n),
        *_latency_rows("trio, both sides on one core", samples),
    ]


# --- stdlib blocking sockets, server in another process --------------------------------------------------


def _serve_blocking(boundary_dir: str, listener: socket.socket, n: int, out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    boundary = load_bundle(Path(boundary_dir), Role.BOUNDARY)
    ctx = server_context(boundary)
    cpu0 = _cpu()
    for _ in range(n):
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            verify_peer(tls, boundary, expected_alpn=ALPN_OPS)
            tls.sendall(b"!")
            tls.recv(1)
    out.put(_cpu() - cpu0)


def bench_stdlib(control: Bundle, boundary: Bundle, n: int) -> list[dict[str, object]]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    address = listener.getsockname()
    out: multiprocessing.SimpleQueue = multiprocessing.get_context("fork").SimpleQueue()  # type: ignore[type-arg]
    server = multiprocessing.get_context("fork").Process(
        target=_serve_blocking, args=(str(boundary.directory), listener, n, out), daemon=True
    )
    server.start()
    listener.close()
    cctx = client_context(control, [ALPN_OPS])
    samples: list[float] = []
    cpu0, wall0 = _cpu(), time.perf_counter()
    for _ in range(n):
        start = time.perf_counter()
        with cctx.wrap_socket(socket.create_connection(address)) as tls:
            verify_peer(tls, control, expected_alpn=ALPN_OPS)
            tls.recv(1)
            tls.sendall(b"!")
        samples.append(time.perf_counter() - start)
    wall, client_cpu = time.perf_counter() - wall0, _cpu() - cpu0
    server.join(60)
    server_cpu = out.get()
    return [
        _row("mTLS handshakes/s (blocking ssl, server and client in two processes)", "handshakes/s", n / wall, runs=n),
        _row("mTLS handshake CPU, server side incl. verify_peer (boundary)", "ms", server_cpu / n * 1000, runs=n),
        _row("mTLS handshake CPU, client side incl. verify_peer (control)", "ms", client_cpu / n * 1000, runs=n),
        *_latency_rows("blocking ssl, two processes", samples),
    ]


# --- verify_peer alone --------------------------------------------------------------------------------------


def bench_verify_peer(control: Bundle, boundary: Bundle, n: int) -> list[dict[str, object]]:
    listener = socket.create_server(("127.0.0.1", 0))
    raw = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    listener.close()
    client = client_context(control, [ALPN_OPS]).wrap_socket(raw, do_handshake_on_connect=False)
    server = server_context(boundary).wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
    client.setblocking(False)
    server.setblocking(False)
    for _ in range(1000):  # drive both handshakes by hand on one thread
        done = 0
        for side in (client, server):
            try:
                side.do_handshake()
                done += 1
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
        if done == 2:
            break
    else:
        raise RuntimeError("handshake did not complete")
    m = n * 10
    start = time.perf_counter()
    for _ in range(m):
        verify_peer(server, boundary, expected_alpn=ALPN_OPS)
    cached = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        tls._checked_peer.cache_clear()
        verify_peer(server, boundary, expected_alpn=ALPN_OPS)
    first = time.perf_counter() - start
    client.close()
    server.close()
    return [
        _row("verify_peer, certificate seen before (cached issuer/claims check)", "us", cached / m * 1e6, runs=m),
        _row("verify_peer, certificate seen first (ECDSA verify + claims parse)", "us", first / n * 1e6, runs=n),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON row per result on stdout")
    parser.add_argument("--quick", action="store_true", help="fewer handshakes (100 instead of 1000)")
    parser.add_argument("-n", type=int, default=None, help="handshakes per measurement")
    args = parser.parse_args(argv)
    n = args.n or (100 if args.quick else 1000)

    with tempfile.TemporaryDirectory(prefix="bench-handshake-") as tmp:
        issue_bundle(Path(tmp), CLAIMS)
        control = load_bundle(Path(tmp) / "control", Role.CONTROL)
        boundary = load_bundle(Path(tmp) / "boundary", Role.BOUNDARY)
        rows = [
            *bench_trio(control, boundary, n),
            *bench_stdlib(control, boundary, n),
            *bench_verify_peer(control, boundary, n),
        ]
    note = f"{ssl.OPENSSL_VERSION}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    for row in rows:
        row["note"] = note
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['name']:<72} {row['value']:>10} {row['unit']}")
    if not args.json:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
