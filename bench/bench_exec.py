"""``exec true`` round trip on the boundary's process side: latency p50/p99.

Two measurements, both from an already-running boundary (no interpreter start-up, no control, no TLS):

- ``table``: ``ProcessTable.start`` (the launcher forks, the child applies every control, ``execve`` succeeds)
  followed by ``wait`` for its exit status;
- ``stream``: the same, plus an exec channel attached with ``pump_exec`` on an in-memory stream until the
  ``EXIT`` frame is decoded by a client (what an operator API call adds on this side);
- ``agent_exit_cascade_ms``: the agent exits → every other workload process has ended (target ≤ 1 s; one
  of them ignores SIGTERM, so this includes the end-all grace).

The launcher is forked before trio starts (its rule), with the strongest privilege model available (R as
root: network, mount and PID namespaces; else what ``detect_privilege_model`` finds).

    python3 bench/bench_exec.py [--runs N] [--model auto|R|U|P] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import trio
import trio.testing

from bench.stats import percentile
from supervisor.boundary.forkimage import NamespacePlan
from supervisor.boundary.process import Launcher, detect_privilege_model
from supervisor.boundary.process.environment import build_process_spec, managed_env
from supervisor.boundary.process.exec_session import pump_exec
from supervisor.boundary.process.table import ProcessTable
from supervisor.jsonlog import JsonLog
from supervisor.protocol.channel import CLOSED, NEED_DATA, ChannelDecoder, Direction, Exit
from supervisor.protocol.exit_result import ExitResult
from supervisor.protocol.process_ops import parse_exec_request


async def read_exit(stream: trio.abc.ReceiveStream) -> ExitResult:
    decoder = ChannelDecoder(Direction.TO_CLIENT)
    while True:
        event = decoder.next_frame()
        if event is NEED_DATA:
            decoder.receive_data(await stream.receive_some(65536))
        elif event is CLOSED:
            raise RuntimeError("stream closed without EXIT")
        elif isinstance(event, Exit):
            return event.result


async def _bench(launcher: Launcher, model: str, runs: int) -> dict[str, Any]:
    await launcher.prepare(NamespacePlan(model))  # type: ignore[arg-type]
    uid = 1000 if os.geteuid() == 0 else os.geteuid()
    gid = 1000 if os.geteuid() == 0 else os.getegid()
    spec = build_process_spec(
        parse_exec_request({"argv": ["true"]}),
        agent_uid=uid, agent_gid=gid, managed_env=managed_env(), default_cwd="/", landlock=None,
    )  # fmt: skip
    table = ProcessTable(launcher, log=JsonLog("bench", stream=open(os.devnull, "w")))  # noqa: SIM115, ASYNC230
    samples: dict[str, list[float]] = {"table": [], "stream": []}
    async with trio.open_nursery() as nursery:
        await nursery.start(table.run)
        for i in range(runs + 20):  # the first 20 warm up
            t0 = time.perf_counter()
            entry = await table.start(spec, kind="exec")
            result = await table.wait(entry.handle, None)
            t1 = time.perf_counter()
            assert result.code == 0, result
            client, server = trio.testing.memory_stream_pair()
            t2 = time.perf_counter()
            entry = await table.start(spec, kind="exec")
            async with trio.open_nursery() as inner:
                inner.start_soon(pump_exec, entry, server)
                result = await read_exit(client)
            t3 = time.perf_counter()
            assert result.code == 0, result
            if i >= 20:
                samples["table"].append((t1 - t0) * 1000)
                samples["stream"].append((t3 - t2) * 1000)
        nursery.cancel_scope.cancel()
    report: dict[str, Any] = {
        name: {"p50_ms": round(percentile(v, 50), 3), "p99_ms": round(percentile(v, 99), 3), "runs": len(v)}
        for name, v in samples.items()
    }
    return report


async def _cascade(launcher: Launcher, uid: int) -> float:
    """Agent exit → every other workload process ended (spec §1.6 bound: 1 s). One of them ignores SIGTERM."""
    table = ProcessTable(launcher, log=JsonLog("bench", stream=open(os.devnull, "w")))  # noqa: SIM115, ASYNC230

    def spec(script: str) -> Any:
        return build_process_spec(
            parse_exec_request({"argv": ["/bin/sh", "-c", script]}),
            agent_uid=uid, agent_gid=uid, managed_env={}, default_cwd="/", landlock=None,
        )  # fmt: skip

    async with trio.open_nursery() as nursery:
        await nursery.start(table.run)
        agent = await table.start(spec("read x"), kind="agent")
        execs = [await table.start(spec("sleep 60 & sleep 60"), kind="exec") for _ in range(4)]
        execs.append(await table.start(spec("trap '' TERM; sleep 60"), kind="exec"))
        await trio.sleep(0.2)
        assert agent.stdin_fd is not None
        t0 = time.perf_counter()
        os.write(agent.stdin_fd.fileno(), b"\n")
        for e in execs:
            await table.wait(e.handle, None)
        elapsed = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return elapsed


async def _cascade_run(launcher: Launcher, model: str) -> float:
    await launcher.prepare(NamespacePlan(model))  # type: ignore[arg-type]
    return await _cascade(launcher, 1000 if os.geteuid() == 0 else os.geteuid())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--model", default="auto", choices=["auto", "R", "U", "P"])
    parser.add_argument("--json", action="store_true", help="one JSON row per line (bench/micro.py's shape)")
    parser.add_argument("--quick", action="store_true", help="100 runs")
    args = parser.parse_args()
    if args.quick:
        args.runs = min(args.runs, 100)
    model, why = detect_privilege_model(args.model)
    launcher = Launcher.fork()  # before trio.run and before any thread
    cascade_launcher = Launcher.fork()  # agent exit ends its workload for good: a launcher of its own
    try:
        report = trio.run(_bench, launcher, model, args.runs)
        report["agent_exit_cascade_ms"] = round(trio.run(_cascade_run, cascade_launcher, model) * 1000, 1)
    finally:
        launcher.close()
        cascade_launcher.close()
    if not args.json:
        print(json.dumps({"bench": "exec_true_round_trip", "model": model, "model_reason": why, **report}, indent=2))
        return
    for name, what in (("table", "start + wait"), ("stream", "start + EXIT frame on a channel")):
        row = report[name]
        print(json.dumps({
            "name": f"exec true, boundary side ({what})", "unit": "ms", "value": row["p50_ms"], "p50": row["p50_ms"],
            "p99": row["p99_ms"], "runs": row["runs"], "note": f"model {model}, no control/link/TLS",
        }))  # fmt: skip
    print(json.dumps({
        "name": "agent exit → workload ended", "unit": "ms", "value": report["agent_exit_cascade_ms"],
        "target": 1000.0, "note": "one process ignores SIGTERM (end-all grace included)",
    }))  # fmt: skip


if __name__ == "__main__":
    main()
