"""The client driver: runs :mod:`bench.clients` on command, wherever the client has to run.

Every contender is measured by this one program, under one interpreter (``/usr/bin/python3`` where it
exists), started from one world-readable copy of ``bench/{clients,wire,driver}.py``: in the harness's own
network namespace for direct and the peer proxies, and *as the agent* inside the sandbox for openshell
(the boundary serves only workload processes, and the agent's uid cannot read the harness's interpreter).
Only the standard library and those two modules are imported here, so the copy is all it needs.

Protocol, one JSON object per line: the driver first writes ``{"ready": true, ...facts}``; then for each
request ``{"op": NAME, "args": {...}}`` read from stdin it writes ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": "Type: message"}``. Operations: ``bulk``, ``setup_sequential``,
``setup_concurrent``, ``idle_open`` (opens and *holds* the connections), ``idle_close``, and the
intercepted path's ``https_setup_sequential`` and ``https_download`` (``bench.tls_clients``). Timing happens
here, around the client calls, so the pipe to the harness costs nothing that is measured. The driver exits
when its stdin closes.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script (``python3 -I``: no script directory on sys.path): the copy's bench
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import clients, tls_clients
from bench.wire import Direction, proxy_address

Address = tuple[str, int]


def _address(value: Any) -> Address | None:
    return None if value is None else (str(value[0]), int(value[1]))


class Driver:
    """The state between requests: at most one batch of held idle connections."""

    def __init__(self) -> None:
        self.idle: clients.IdleHold | None = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op, args = request.get("op"), request.get("args", {})
        proxy, target = _address(args.get("proxy")), _address(args.get("target"))
        if op == "bulk":
            assert target is not None
            done = clients.bulk(proxy, target, Direction(args["direction"]), int(args["size"]), float(args["timeout"]))
            return {"size": done.size, "seconds": done.seconds}
        if op in ("setup_sequential", "setup_concurrent"):
            assert target is not None
            if op == "setup_sequential":
                batch = clients.setup_sequential(proxy, target, int(args["count"]), float(args["timeout"]),
                                                 float(args["budget"]))  # fmt: skip
            else:
                batch = clients.setup_concurrent(proxy, target, int(args["count"]), int(args["concurrency"]),
                                                 float(args["timeout"]), float(args["budget"]))  # fmt: skip
            return {
                "latencies": batch.latencies,
                "errors": batch.errors,
                "seconds": batch.seconds,
                "error_kinds": batch.error_kinds,
                "steps": batch.steps,
            }
        if op == "idle_open":
            assert target is not None
            self.close_idle()
            self.idle = clients.open_idle(proxy, target, int(args["count"]), int(args["concurrency"]),
                                          float(args["timeout"]), float(args["budget"]))  # fmt: skip
            return {
                "opened": len(self.idle.sockets),
                "errors": self.idle.errors,
                "seconds": self.idle.seconds,
                "error_kinds": self.idle.error_kinds,
            }
        if op == "idle_close":
            return {"closed": self.close_idle()}
        if op == "https_setup_sequential":  # the intercepted path (bench.tls_clients)
            assert target is not None
            batch = tls_clients.https_setup_sequential(proxy, target, args.get("cafile"), int(args["count"]),
                                                       float(args["timeout"]), float(args["budget"]))  # fmt: skip
            return {
                "latencies": batch.latencies,
                "errors": batch.errors,
                "seconds": batch.seconds,
                "error_kinds": batch.error_kinds,
            }
        if op == "https_download":
            assert target is not None
            got = tls_clients.https_download(proxy, target, args.get("cafile"), int(args["size"]),
                                             float(args["timeout"]))  # fmt: skip
            return {"size": got.size, "seconds": got.seconds}
        raise ValueError(f"unknown op {op!r}")

    def close_idle(self) -> int:
        if self.idle is None:
            return 0
        count = len(self.idle.sockets)
        self.idle.close()
        self.idle = None
        return count


def facts() -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return {
        "ready": True, "uid": os.getuid(), "python": sys.version.split()[0], "executable": sys.executable,
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        # the proxy its environment names (host and port, never the userinfo), and whether it sends credentials
        "proxy_env": proxy_address(os.environ), "proxy_authorization": bool(clients.PROXY_AUTHORIZATION),
    }  # fmt: skip


def main() -> int:
    out = sys.stdout
    out.write(json.dumps(facts()) + "\n")
    out.flush()
    driver = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply: dict[str, Any] = {"ok": True, "result": driver.handle(json.loads(line))}
        except Exception as exc:  # one failed request is that request's answer, never the driver's end
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    driver.close_idle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
