"""``exec true`` round trip through the whole product, two ways (docs/design.md "Exec latency"):

- ``api``: from an already-running client, over control's operator API (h11 upgrade on the Unix socket) →
  control → the ops link (HTTP/2 over mTLS) → boundary → launcher → ``execve`` → EXIT frame back. The 5 ms
  target applies here.
- ``cli``: ``openshell-sandbox exec -- true`` as a user types it: interpreter start-up included.

It starts its own dev sandbox (as root: model R) with a private runtime directory and stops it afterwards.

    python3 -m bench.bench_exec_e2e [--runs N] [--cli-runs N] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import trio

from bench.bench_exec import read_exit
from bench.stats import percentile
from supervisor.cli.api_client import Api, find_api, open_channel, request_json

CLI = [sys.executable, "-m", "supervisor.cli"]


async def _exec_true(api: Api) -> None:
    stream, _ = await open_channel(api, "/v1/exec", {"argv": ["true"], "stdin": "null"})
    async with stream:
        result = await read_exit(stream)
    if result.rendered != 0:
        raise RuntimeError(f"exec true failed: {result}")


async def _api_latencies(api: Api, runs: int) -> list[float]:
    for _ in range(5):  # warm up (first exec pays imports and caches)
        await _exec_true(api)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await _exec_true(api)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _wait_ready(env: dict[str, str], timeout: float = 30) -> Api:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.environ["XDG_RUNTIME_DIR"] = env["XDG_RUNTIME_DIR"]
            api = find_api(None)
            status, _body = trio.run(request_json, api, "GET", "/readyz")
            if status == 200:
                return api
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError("the dev sandbox did not become ready")


@contextlib.contextmanager
def dev_sandbox() -> Iterator[tuple[Api, dict[str, str], subprocess.Popen[bytes]]]:
    """A dev sandbox (agent: ``sleep``) in a private runtime directory, ready: its API, the environment that
    finds it, and the ``dev`` process; stopped and cleaned up on exit."""
    runtime = tempfile.mkdtemp(prefix="osr-bench-", dir="/tmp")
    # dev keeps its events log and workdir under XDG_STATE_HOME after it exits: here, removed with the rest.
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "XDG_STATE_HOME": os.path.join(runtime, "state")}
    dev = subprocess.Popen([*CLI, "dev", "--", "sleep", "100000"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        yield _wait_ready(env), env, dev
    finally:
        dev.terminate()
        dev.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cli-runs", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--quick", action="store_true", help="at most 50 API runs and 5 CLI runs")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.cli_runs = min(args.runs, 50), min(args.cli_runs, 5)
    with dev_sandbox() as (api, env, _dev):
        api_ms = trio.run(_api_latencies, api, args.runs)
        cli_ms = []
        for _ in range(args.cli_runs):
            started = time.perf_counter()
            done = subprocess.run([*CLI, "exec", "--", "true"], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"exec through the CLI failed ({done.returncode}): {done.stderr.strip()}")
            cli_ms.append((time.perf_counter() - started) * 1000)
    result: dict[str, Any] = {
        "bench": "exec_e2e",
        "api_p50_ms": round(percentile(api_ms, 50), 2),
        "api_p99_ms": round(percentile(api_ms, 99), 2),
        "cli_p50_ms": round(percentile(cli_ms, 50), 1),
        "cli_p99_ms": round(percentile(cli_ms, 99), 1),
        "runs": args.runs,
        "cli_runs": args.cli_runs,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for via, runs in (("api", args.runs), ("cli", args.cli_runs)):
            p50, p99 = result[f"{via}_p50_ms"], result[f"{via}_p99_ms"]
            print(f"exec true via {via.upper()}: p50 {p50} ms  p99 {p99} ms  ({runs} runs)")


if __name__ == "__main__":
    main()
