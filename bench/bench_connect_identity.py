"""What recording identity at ``connect()`` costs a connection's setup (docs/design.md "Identity").

    python3 bench/bench_connect_identity.py [--json] [--quick] [-n N] [--rounds R]

One process is the agent, this one the boundary, on 127.0.0.1. The agent opens N connections one after the
other; for each, the boundary accepts, resolves the identity and answers one byte; the agent measures from
``connect()`` to that byte. Two variants, alternated round by round in the same run:

* ``connect``: the agent runs under the connect-notify filter and the boundary serves its listener
  (supervisor/boundary/capture/connect_notify.py); at accept, the record is found by inode and cookie;
* ``accept``: no filter; identity is resolved at accept from ``/proc`` (the fallback).

Rows: each variant's p50 (median over rounds) and the added p50 of ``connect`` over ``accept`` (the median of
the per-round differences), whose target is 0.2 ms. With ``--json`` each is one JSON row (bench/micro.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys

import trio

from supervisor.boundary.capture import connect_notify
from supervisor.boundary.capture.connect_notify import ConnectNotifier
from supervisor.boundary.capture.connect_record import ConnectRecords, ExecLog
from supervisor.boundary.capture.identity import IdentityResolver
from supervisor.boundary.forkimage import linux, seccomp

AGENT = """
import json, socket, sys, time
address, count = ("127.0.0.1", int(sys.argv[1])), int(sys.argv[2])
latencies, bad = [], 0
for _ in range(count):
    sock = socket.socket()
    started = time.perf_counter_ns()
    sock.connect(address)
    answer = sock.recv(1)
    latencies.append(time.perf_counter_ns() - started)
    sock.close()
    bad += answer != b"k"
latencies.sort()
print(json.dumps({"p50_us": latencies[len(latencies) // 2] / 1000, "bad": bad}))
"""


def _spawn(hand_off: socket.socket | None, port: int, count: int) -> tuple[int, int]:
    """Fork the agent (under the filter when ``hand_off`` is given); returns (pid, its stdout's read end)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the agent
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
            if hand_off is not None:
                listener = seccomp.install_listener(seccomp.notify_program())
                socket.send_fds(hand_off, [b"listener"], [listener])
                os.close(listener)
            os.execv(sys.executable, [sys.executable, "-c", AGENT, str(port), str(count)])
        finally:
            os._exit(127)
    os.close(write_end)
    return pid, read_end


async def _round(at_connect: bool, count: int) -> dict[str, float]:
    agent: dict[str, int] = {}
    resolver = IdentityResolver(
        anchor_pid=os.getpid(),
        workload_pids=lambda: {agent["pid"]} if "pid" in agent else set(),
        agent_pid=lambda: agent.get("pid"),
        sock_diag=socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4),
        scan_foreign=False,
        records=ConnectRecords() if at_connect else None,
        exec_log=ExecLog() if at_connect else None,
    )
    notifier = ConnectNotifier(resolver) if at_connect else None
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    refused = 0

    async def serve() -> None:
        nonlocal refused
        while True:
            conn, peer = await listener.accept()
            with conn:
                try:
                    resolver.resolve(conn.getsockname()[:2], peer[:2])
                except Exception:
                    refused += 1
                    continue
                await conn.send(b"k")

    async with trio.open_nursery() as nursery:
        if notifier is not None:
            nursery.start_soon(notifier.serve)
        nursery.start_soon(serve)
        pid, out_fd = _spawn(notifier.child_end() if notifier else None, listener.getsockname()[1], count)
        agent["pid"] = pid
        os.set_blocking(out_fd, False)
        out = b""
        while True:
            await trio.lowlevel.wait_readable(out_fd)
            chunk = os.read(out_fd, 65536)
            if not chunk:
                break
            out += chunk
        os.close(out_fd)
        await trio.to_thread.run_sync(os.waitpid, pid, 0)
        nursery.cancel_scope.cancel()
    if notifier is not None:
        notifier.close()
    listener.close()
    result = json.loads(out)
    if refused or result["bad"]:
        raise RuntimeError(f"{refused} connections refused, {result['bad']} without an answer")
    return {"p50_us": float(result["p50_us"])}


async def _measure(count: int, rounds: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"connect": [], "accept": []}
    for index in range(rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        for at_connect in order:
            got["connect" if at_connect else "accept"].append((await _round(at_connect, count))["p50_us"] / 1000)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON row per result (bench/micro.py)")
    parser.add_argument("--quick", action="store_true", help="fewer connections and rounds")
    parser.add_argument("-n", type=int, default=None, help="connections per round (default 1000, quick 300)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per variant (default 7, quick 3)")
    args = parser.parse_args()
    if not connect_notify.available():
        print("this kernel has no SECCOMP_RET_USER_NOTIF (or pidfd_getfd is denied)", file=sys.stderr)
        return 1
    count = args.n or (300 if args.quick else 1000)
    rounds = args.rounds or (3 if args.quick else 7)
    got = trio.run(_measure, count, rounds)
    added = [c - a for c, a in zip(got["connect"], got["accept"], strict=True)]
    rows = [
        {"name": "connect identity: setup p50, recorded at connect", "unit": "ms",
         "value": statistics.median(got["connect"]), "min": min(got["connect"]), "max": max(got["connect"]),
         "runs": rounds},
        {"name": "connect identity: setup p50, resolved at accept", "unit": "ms",
         "value": statistics.median(got["accept"]), "min": min(got["accept"]), "max": max(got["accept"]),
         "runs": rounds},
        {"name": "connect identity: added p50 (paired per round)", "unit": "ms", "value": statistics.median(added),
         "min": min(added), "max": max(added), "runs": rounds, "target": 0.2},
    ]  # fmt: skip
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['name']:52s} {row['value']:.3f} ms  (min {row['min']:.3f}, max {row['max']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
