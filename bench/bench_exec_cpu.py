"""CPU time per ``exec true`` through the operator API, for the whole sandbox.

Wall time on a shared, loaded machine mostly measures the wait for a core; CPU time does not. This starts a
dev sandbox (as ``bench_exec_e2e`` does), runs ``exec true`` from an already-running client, and reads from
``/proc`` the CPU time (user + system) of every process of the sandbox before and after: each process's own
plus what it reaped (exec-inits and commands are reaped inside the sandbox, so their time is counted), split
by role (dev, control, boundary, zygote, init and below). The client's own CPU is reported apart.

    python3 -m bench.bench_exec_cpu [--runs N] [--json]

The full bench runs it among its micro-benchmarks (``--json``: one row per figure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

import trio

from bench.bench_exec_e2e import _exec_true, dev_sandbox
from bench.stats import percentile

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> dict[int, tuple[int, str]]:
    """pid -> (ticks of its own and of what it reaped, role) for ``root`` and every descendant."""
    found: dict[int, tuple[int, str]] = {}
    stack = [(root, "dev")]
    while stack:
        pid, role = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            continue
        if role == "dev" and b"--mode=control" in cmdline:
            role = "control"
        elif role == "dev" and b"--mode=boundary" in cmdline:
            role = "boundary"
        elif role == "boundary" and pid != root:
            role = "zygote"
        elif role == "zygote":
            role = "init_and_below"
        found[pid] = (sum(int(f) for f in fields[11:15]), role)
        stack += [(kid, role) for kid in kids]
    return found


def _roles(before: dict[int, tuple[int, str]], after: dict[int, tuple[int, str]]) -> dict[str, float]:
    """Ticks spent in the window, by role (a process gone by ``after`` was reaped by one still there)."""
    spent: dict[str, float] = {}
    for pid, (ticks, role) in after.items():
        start = before.get(pid, (0, role))[0]
        spent[role] = spent.get(role, 0) + (ticks - start)
    return spent


async def _run(api: Any, runs: int, root: int) -> dict[str, Any]:
    for _ in range(10):
        await _exec_true(api)
    ours0 = resource.getrusage(resource.RUSAGE_SELF)
    before, load0 = _tree(root), os.getloadavg()[0]
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        await _exec_true(api)
        walls.append((time.perf_counter() - started) * 1000)
    after, load1 = _tree(root), os.getloadavg()[0]
    ours1 = resource.getrusage(resource.RUSAGE_SELF)
    spent = {role: round(t * 1000 / CLK_TCK / runs, 2) for role, t in sorted(_roles(before, after).items())}
    client = (ours1.ru_utime + ours1.ru_stime - ours0.ru_utime - ours0.ru_stime) * 1000 / runs
    return {
        "bench": "exec_cpu",
        "runs": runs,
        "load": [round(load0, 1), round(load1, 1)],
        "api_p50_ms": round(percentile(walls, 50), 2),
        "sandbox_cpu_ms_per_exec": {**spent, "total": round(sum(spent.values()), 2)},
        "client_cpu_ms_per_exec": round(client, 2),
    }


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``result`` as bench/micro.py rows (one JSON object per line): the CPU per exec of the whole sandbox, of
    each daemon, of the workload's init and below, and of the client, next to this loop's own p50. CPU time
    moves less than wall time from one window of a shared machine to the next (docs/performance.md)."""
    runs, cpu = result["runs"], result["sandbox_cpu_ms_per_exec"]
    figures = [("sandbox CPU per exec", cpu["total"])]
    figures += [
        (f"{role} CPU per exec", cpu[role]) for role in ("control", "boundary", "init_and_below") if role in cpu
    ]
    figures += [
        ("client CPU per exec", result["client_cpu_ms_per_exec"]),
        ("p50 of the CPU loop", result["api_p50_ms"]),
    ]
    return [
        {"name": f"exec true via API: {what}", "unit": "ms", "value": value, "runs": runs} for what, value in figures
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="one JSON row per line (bench/micro.py's contract)")
    args = parser.parse_args()
    with dev_sandbox() as (api, _env, dev):
        result = trio.run(_run, api, args.runs, dev.pid)
    if args.json:
        for row in rows(result):
            print(json.dumps(row))
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
