"""Where an exec's time goes on the boundary's process side, per hop, in wall time and in CPU time.

From an already-running launcher (model R as root: the workload's network, mount and PID namespaces), each run
launches ``true`` the way an operator exec is launched (``own_pidns``: a PID namespace of its own) and times:

- ``reply_ms``: ``spawn`` sent → the pidfd is back (boundary → zygote → init → fork or hand-off → back);
- ``execve_ms``: → the status pipe's EOF (every child stage done, ``execve`` succeeded);
- ``exit_ms``: → the exit status reported (command → exec-init → init → zygote → boundary);
- ``cpu_ms``: CPU time (user + system) per exec of every process involved, read from ``/proc``: the boundary,
  the zygote, the init and everything it reaped (exec-inits and, through them, the commands).

A sleeping agent holds the namespace, as in a sandbox. ``--no-own-pidns`` launches into the workload's namespace.
Run it against another tree with ``PYTHONPATH=<tree> python bench/bench_exec_hops.py`` for an A/B comparison.

    python3 -m bench.bench_exec_hops [--runs N] [--no-own-pidns] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import trio

from supervisor.boundary.forkimage import NamespacePlan, SpawnSpec
from supervisor.boundary.process import Launcher

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int, children: bool) -> float:
    """utime + stime (+ cutime + cstime: what it reaped) of ``pid``, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / CLK_TCK


def _cpu_by_process(launcher: Launcher) -> dict[str, float]:
    init = launcher._init_pid
    assert init is not None, "model R with a PID namespace expected"
    return {
        "boundary": _cpu_s(os.getpid(), False),
        "zygote": _cpu_s(launcher.pid, False),
        "init_and_reaped": _cpu_s(init, True),
    }


async def _run(launcher: Launcher, runs: int, own_pidns: bool) -> dict[str, Any]:
    await launcher.prepare(NamespacePlan("R"))
    uid = gid = 1000
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    agent = await launcher.spawn(SpawnSpec(("sleep", "100000"), env, "/", uid, gid, stdin="null"))
    spec = SpawnSpec(("true",), env, "/", uid, gid, stdin="null")
    samples: dict[str, list[float]] = {"reply_ms": [], "execve_ms": [], "exit_ms": [], "total_ms": []}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.wait_status)
        for _ in range(10):  # warm up
            await (await launcher.spawn(spec, own_pidns=own_pidns)).wait_status()
        cpu0, load0 = _cpu_by_process(launcher), os.getloadavg()[0]
        for _ in range(runs):
            t0 = time.perf_counter()
            spawned, t1, t2 = await _timed_spawn(launcher, spec, own_pidns)
            status = await spawned.wait_status()
            t3 = time.perf_counter()
            assert status == 0, status
            for key, value in (("reply_ms", t1 - t0), ("execve_ms", t2 - t1), ("exit_ms", t3 - t2)):
                samples[key].append(value * 1000)
            samples["total_ms"].append((t3 - t0) * 1000)
        cpu1, load1 = _cpu_by_process(launcher), os.getloadavg()[0]
        nursery.cancel_scope.cancel()
    cpu = {name: round((cpu1[name] - cpu0[name]) * 1000 / runs, 2) for name in cpu0}
    return {
        "bench": "exec_hops",
        "own_pidns": own_pidns,
        "runs": runs,
        "load": [round(load0, 1), round(load1, 1)],
        **{key: round(sorted(v)[len(v) // 2], 2) for key, v in samples.items()},
        "cpu_ms_per_exec": {**cpu, "total": round(sum(cpu.values()), 2)},
    }


async def _timed_spawn(launcher: Launcher, spec: SpawnSpec, own_pidns: bool) -> tuple[Any, float, float]:
    """``Launcher.spawn`` split at the reply: the reply is timed by wrapping ``_request`` for this call."""
    original = launcher._request
    replied: list[float] = []

    async def request(op: str, *args: Any, **kw: Any) -> Any:
        got = await original(op, *args, **kw)
        replied.append(time.perf_counter())
        return got

    launcher._request = request  # type: ignore[method-assign]
    try:
        spawned = await launcher.spawn(spec, own_pidns=own_pidns)
    finally:
        del launcher._request
    return spawned, replied[0], time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--no-own-pidns", action="store_true", help="launch into the workload's PID namespace")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_exec_hops needs root (model R)")
    launcher = Launcher.fork()  # before trio and any thread
    try:
        result = trio.run(_run, launcher, args.runs, not args.no_own_pidns)
    finally:
        launcher.close()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
