"""The benchmark run: set up peers and upstream, measure every scenario for every contender, report.

Theory of operation:

* Everything is started once per run of the harness — the upstream process, then every contender —
  and stopped in a ``finally``: no proxy, upstream or temporary directory outlives the harness.
* Each of the ``--runs`` rounds measures every scenario for every contender, the contenders in a
  rotated order each round, so that a slow moment of the shared machine, or a warm cache, lands on
  a different contender each time; ratios are taken within a round (see ``bench.stats``).
* The upstream lives on a host of its own: a network namespace the harness creates, reached over a veth
  pair on a TEST-NET address (``tests/netns_hosts.py``), because the sandbox's control refuses loopback upstreams.
  Every contender reaches it there, at the same address; every peer's listener is on 127.0.0.1, the
  sandbox's is in its agent's namespace. Without root (no namespace) the upstream falls back to
  127.0.0.1 and the sandbox is skipped, saying why. Nothing is ever sent anywhere else.
* Every contender is measured by the same client driver (``bench.driver``, under ``/usr/bin/python3``):
  one in the harness's namespace for direct and the peers, and the sandbox's agent for openshell.
* ``--profile NAME`` adds one extra, unmeasured pass of the bulk and setup scenarios with py-spy
  attached to NAME's processes, so profiling never perturbs the numbers in the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench import interpreter, micro, procstat, setup_peers, targets
from bench.clients import Address
from bench.contenders import FACTORIES, BenchContext, Contender, ContenderUnavailable
from bench.origin import TlsMaterial, make_material
from bench.profiling import Recording, format_top
from bench.remote import ClientDriver, client_copy, spawn_local
from bench.report import (
    Results,
    add_derived,
    aligned,
    build_rows,
    format_markdown,
    format_summary,
    format_summary_markdown,
    format_text,
    markdown,
    rows_json,
)
from bench.scenarios import MIB, Config, Probe, Scenario, build, idle_sizes
from bench.upstream import raise_nofile_soft_limit
from bench.wire import Direction
from tests.netns_hosts import NetnsHost, open_upstream_host, unavailable_reason

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEFAULT_ORDER = ("direct", "openshell", "openshell-proxy-pod", "tinyproxy", "squid", "proxy.py", "mitmproxy",
                 "squid-bump")  # fmt: skip
PROFILED_KINDS = ("bulk", "setup")
UNPROFILED_GROUPS = ("launcher",)  # the sandbox's launcher forks sit idle during egress


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller transfers and counts (~5 minutes on two cores)")
    parser.add_argument("--runs", type=int, default=5, help="rounds per cell (default 5, at least 1)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="directory for results")
    parser.add_argument(
        "--contenders", default=",".join(DEFAULT_ORDER),
        help="comma-separated, of: " + ", ".join(DEFAULT_ORDER) + " (the default), and on request "
        + ", ".join(name for name in FACTORIES if name not in DEFAULT_ORDER),
    )  # fmt: skip
    parser.add_argument("--profile", metavar="CONTENDER", help="py-spy profile of this contender's processes")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get or pip install peers")
    parser.add_argument("--no-micro", action="store_true", help="skip bench/bench_*.py micro-benchmarks")
    parser.add_argument(
        "--daemon-python",
        metavar="PATH",
        default=interpreter.default_daemon_python(),
        help="interpreter the sandbox's daemons run on (default: the Makefile's .venv/bin/python, "
        "built from Debian's /usr/bin/python3 as the image ships; else the harness's own)",
    )
    parser.add_argument(
        "--kinds",
        default="bulk,setup,idle",
        help="comma-separated scenario kinds to run, of: bulk, setup, idle (default all; for A/B runs of one kind)",
    )
    parser.add_argument(
        "--idle-budget",
        type=float,
        metavar="SECONDS",
        help="time allowed for opening the idle connections (default 15, quick 10)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; choose from {list(FACTORIES)}")
    if "direct" not in names:
        names.insert(0, "direct")  # every ratio needs it
    args.contender_names = names
    args.kind_names = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kind_names or set(args.kind_names) - {"bulk", "setup", "idle"}:
        parser.error(f"--kinds {args.kinds!r}: choose from bulk, setup, idle")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.idle_budget is not None and args.idle_budget <= 0:
        parser.error("--idle-budget must be positive")
    if args.profile and args.profile not in names:
        parser.error(f"--profile {args.profile} is not among the contenders")
    return args


def make_config(quick: bool, runs: int, nofile: int) -> tuple[Config, list[str]]:
    if quick:
        sizes, notes = idle_sizes((1000,), nofile)
        notes.append("quick: the 10,000-connection idle scenario is left out")
        notes.append("quick: of the intercepted rows only setup (100 HTTPS exchanges); the download is left out")
        return Config(runs, 128 * MIB, 300, 1280, 64, sizes, setup_budget=3.0, idle_budget=10.0, idle_hold=0.5,
                      https_sequential=100), notes  # fmt: skip
    sizes, notes = idle_sizes((1000, 10000), nofile)
    return Config(runs, 1024 * MIB, 1000, 4000, 64, sizes, setup_budget=8.0, idle_budget=15.0, https_sequential=500,
                  https_bulk_bytes=256 * MIB), notes  # fmt: skip


class Upstream:
    """The upstream process (``python3 -m bench.upstream``): bulk and echo listeners.

    On ``host`` (inside its namespace) when given, else on 127.0.0.1.
    """

    def __init__(self, host: NetnsHost | None = None) -> None:
        argv = [sys.executable, "-m", "bench.upstream"]
        address = "127.0.0.1"
        if host is None:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        else:
            address = host.address
            self.proc = host.popen([*argv, "--host", address], cwd=REPO, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE)  # fmt: skip
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        if len(words) != 4 or words[0] != b"READY":
            self.stop()
            raise RuntimeError(f"upstream did not start: {words!r}")
        self.bulk: Address = (address, int(words[1]))
        self.echo: Address = (address, int(words[2]))  # one 1 KiB echo, then the upstream closes
        self.idle: Address = (address, int(words[3]))  # one 1 KiB echo, then held until the client ends it

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the upstream exits when its stdin closes
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Origin:
    """The HTTPS origin of the intercepted rows (``python3 -m bench.origin``), beside the upstream on its host.

    Its certificate and the bump CA are fresh for the run (``bench.origin.make_material``), under ``workdir``.
    """

    def __init__(self, workdir: Path, host: NetnsHost | None = None) -> None:
        address = host.address if host is not None else "127.0.0.1"
        self.tls: TlsMaterial = make_material(workdir / "tls", address)
        argv = [sys.executable, "-m", "bench.origin", "--host", address, "--cert", str(self.tls.origin_cert),
                "--key", str(self.tls.origin_key)]  # fmt: skip
        popen = host.popen if host is not None else subprocess.Popen
        self.proc = popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        if len(words) != 2 or words[0] != b"READY":
            self.stop()
            raise RuntimeError(f"HTTPS origin did not start: {words!r}")
        self.address: Address = (address, int(words[1]))

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the origin exits when its stdin closes
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LocalClient:
    """The harness's own client driver (direct and the peers), started again if it ever breaks."""

    def __init__(self, copy: Path) -> None:
        self.copy = copy
        self.driver = spawn_local(copy)

    def get(self) -> ClientDriver:
        if self.driver.broken:
            _log(f"bench: the client driver broke ({self.driver.broken}); starting a new one")
            self.driver.close(timeout=1)
            self.driver = spawn_local(self.copy)
        return self.driver

    def close(self) -> None:
        self.driver.close()


def product_snapshot(workdir: Path) -> tuple[Path, dict[str, object]]:
    """Copy ``supervisor/`` for this run's sandboxes; return the copy's root and which code it is."""
    root = workdir / "product"
    shutil.copytree(REPO / "supervisor", root / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout if done.returncode == 0 else ""

    # Porcelain lines are "XY path": the status columns may start with a space, so nothing is stripped first.
    changed = [line[3:] for line in git("status", "--porcelain", "--", "supervisor").splitlines() if line.strip()]
    return root, {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": changed}


def machine_facts() -> dict[str, object]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
    os_name = ""
    with contextlib.suppress(OSError):
        os_name = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": os_name,
        "python": platform.python_version(),
    }


def budget_notes(results: Results, config: Config) -> list[str]:
    """Setup cells whose time budget ended a batch before every connection was made: the limit hit, named
    (those connections were never started, so they are not failures)."""
    notes: list[str] = []
    for scenario in results.scenarios:
        if scenario.kind != "setup":
            continue
        asked = config.sequential if scenario.name == "setup sequential" else config.concurrent
        if scenario.path == "intercepted":
            asked = config.https_sequential
        for contender in results.contenders:
            done = [v for v in results.series(scenario.name, "conns", contender) if v is not None]
            short = sorted(v for v in done if v < asked)
            if short:
                notes.append(
                    f"{contender} {scenario.name}: the {config.setup_budget:g} s budget ended {len(short)} of "
                    f"{len(done)} rounds early ({short[0]:.0f}–{short[-1]:.0f} of {asked} connections made; "
                    f"{results.errors.get((scenario.name, contender), 0)} failed)"
                )
    return notes


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_cell(results: Results, scenario: Scenario, probe: Probe, run: int) -> None:
    name = probe.contender.name
    started = time.perf_counter()
    try:
        outcome = scenario.measure(probe)
    except Exception as exc:  # one failed cell must not end the run
        results.failures.setdefault((scenario.name, name), []).append(f"run {run + 1}: {type(exc).__name__}: {exc}")
        _log(f"  run {run + 1} {scenario.name:<18} {name:<10} FAILED {type(exc).__name__}: {exc}")
        return
    for key, value in outcome.values.items():
        results.record(scenario.name, key, name, run, value)
    if outcome.errors:
        results.errors[(scenario.name, name)] = results.errors.get((scenario.name, name), 0) + outcome.errors
        kinds = results.error_kinds.setdefault((scenario.name, name), {})
        for kind, count in outcome.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
    shown = ", ".join(f"{k}={v:.4g}" for k, v in outcome.values.items() if v is not None)
    top = max(outcome.error_kinds.items(), key=lambda kv: kv[1], default=None)
    failed = f", {outcome.errors} failed" if outcome.errors else ""
    failed += f" (most: {top[1]} × {top[0]})" if top else ""
    _log(f"  run {run + 1} {scenario.name:<18} {name:<10} {shown}{failed} ({time.perf_counter() - started:.1f} s)")


def restart_all(
    started: list[tuple[Contender, Address | None]], results: Results, run: int
) -> list[tuple[Contender, Address | None]]:
    """Stop every contender (in parallel: squid takes seconds to stop) and start it afresh.

    One that does not come back is measured no more; each scenario's row says why its later runs
    are missing, and its earlier numbers stay.
    """
    stoppers = [threading.Thread(target=c.stop) for c, _ in started]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join()
    restarted: list[tuple[Contender, Address | None]] = []
    for contender, _ in started:
        try:
            restarted.append((contender, contender.start()))
        except ContenderUnavailable as exc:
            for scenario in results.scenarios:
                results.failures.setdefault((scenario.name, contender.name), []).append(
                    f"run {run + 1}: failed to restart: {exc}"
                )
            _log(f"bench: {contender.name} failed to restart: {exc}")
    return restarted


def fresh_rss(contender: Contender, probe: Probe) -> int:
    """RSS (KiB) of a just-started contender after a few connections have warmed it up."""
    with contextlib.suppress(Exception):
        probe.client.open_idle(probe.proxy, probe.idle, 16, 16, probe.config.timeout, budget=5.0).close()
    time.sleep(0.2)
    return procstat.memory(contender.pids()).rss_kib


def warm_up(probe: Probe) -> None:
    """Unrecorded traffic first, so no contender's first round pays for page faults and lazy set-up."""
    paths = probe.contender.paths
    if "raw" in paths:
        with contextlib.suppress(Exception):
            probe.client.setup_sequential(probe.proxy, probe.echo, 50, probe.config.timeout, budget=5.0)
            for direction in Direction:
                probe.client.bulk(probe.proxy, probe.bulk, direction, 16 * MIB, probe.config.timeout)
    if "intercepted" in paths and probe.https is not None:
        with contextlib.suppress(Exception):
            probe.client.https_setup_sequential(probe.proxy, probe.https, probe.trust, 20, probe.config.timeout, 5.0)


def profile_pass(
    contender: Contender, probe: Probe, scenarios: list[Scenario], out: Path, stamp: str
) -> dict[str, object]:
    """One unmeasured pass of the bulk and setup scenarios with py-spy on each of the contender's pid groups."""
    reason = setup_peers.ensure_venv_package("py-spy", "py-spy")
    if reason:
        return {"skipped": reason}
    py_spy = setup_peers.PEERS_VENV / "bin" / "py-spy"
    report: dict[str, object] = {}
    for scenario in (s for s in scenarios if s.kind in PROFILED_KINDS):
        slug = scenario.name.replace(" ", "-")
        groups = {g: pids for g, pids in contender.pid_groups().items() if pids and g not in UNPROFILED_GROUPS}
        recordings = {
            group: Recording(py_spy, pids, out / f"profile-{stamp}-{contender.name}-{slug}-{group}")
            for group, pids in groups.items()
        }
        for recording in recordings.values():
            recording.start()
        with contextlib.suppress(Exception):
            scenario.measure(probe)
        entry: dict[str, object] = {}
        for group, recording in recordings.items():
            errors = recording.stop()
            top = recording.summary()
            text = format_top(top, f"{contender.name} {group} / {scenario.name}")
            if top.samples:
                (out / f"profile-{stamp}-{contender.name}-{slug}-{group}.top.txt").write_text(text + "\n")
                _log(text)
            entry[group] = {
                "files": [str(recording.output(p)) for p in recording.pids if recording.output(p).exists()],
                "samples": top.samples,
                "top_self": top.self_cost,
                "top_total": top.total_cost,
                "errors": {str(pid): err for pid, err in errors.items()},
            }
        report[scenario.name] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    nofile = raise_nofile_soft_limit()
    config, config_notes = make_config(args.quick, args.runs, nofile)
    if args.idle_budget is not None:
        config = replace(config, idle_budget=args.idle_budget)
    scenarios = [s for s in build(config) if s.kind in args.kind_names]
    preflight: dict[str, str] = {}
    if not args.no_install:
        missing = setup_peers.ensure_debian_peers()
        preflight.update(missing)
        if {"squid", "squid-bump"} & set(args.contender_names) and "squid" not in missing:
            reason = setup_peers.ensure_squid_openssl()  # one squid binary for both roles: squid-openssl's
            if reason:
                preflight["squid-bump"] = reason  # the raw squid row runs on either build
        if "mitmproxy" in args.contender_names:
            reason = setup_peers.ensure_venv_package(setup_peers.MITMPROXY_REQUIREMENT, "mitmdump")
            if reason:
                preflight["mitmproxy"] = reason
        if "proxy.py" in args.contender_names:
            reason = setup_peers.ensure_venv_package(setup_peers.PROXY_PY_REQUIREMENT, "proxy")
            if reason:
                preflight["proxy.py"] = reason
    daemon_python: dict[str, object] = {}
    sandboxes = [name for name in args.contender_names if name.startswith("openshell")]
    if sandboxes:
        try:
            daemon_python = interpreter.describe(args.daemon_python)
        except interpreter.InterpreterError as exc:
            preflight.update(dict.fromkeys(sandboxes, str(exc)))
    results = Results(config.runs, list(args.contender_names), scenarios)
    workdir = Path(tempfile.mkdtemp(prefix="openshell-bench-"))
    product, product_facts = product_snapshot(workdir)
    uncommitted = product_facts["uncommitted"]
    run_notes = [f"product: supervisor/ at {product_facts['commit']}"
                 + (f" with {len(uncommitted)} uncommitted file(s)" if isinstance(uncommitted, list) and uncommitted
                    else "")]  # fmt: skip
    copy = client_copy()
    started: list[tuple[Contender, Address | None]] = []
    host: NetnsHost | None = None
    upstream: Upstream | None = None
    origin: Origin | None = None
    local: LocalClient | None = None
    profile: dict[str, object] = {}
    refusals: dict[str, dict[str, int]] = {}  # the sandbox's own account of connections it refused
    facts: dict[str, object] = {}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        host_reason = unavailable_reason() or ""
        if not host_reason:
            try:
                host = open_upstream_host()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                host_reason = f"no upstream host: {exc}"
        if host_reason:
            run_notes.append(f"upstream on 127.0.0.1 ({host_reason})")
        upstream = Upstream(host)
        origin_reason = ""
        if any(s.path == "intercepted" for s in scenarios):
            try:
                origin = Origin(workdir, host)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                origin_reason = f"no HTTPS origin: {exc}"
                run_notes.append(origin_reason)
        ctx = BenchContext(workdir, setup_peers.PEERS_VENV, nofile, copy, upstream.bulk, upstream.echo, upstream.idle,
                           host_reason, product, args.daemon_python, upstream_https=origin.address if origin else None,
                           tls=origin.tls if origin else None)  # fmt: skip
        local = LocalClient(copy)
        facts["harness client"] = local.driver.facts
        for name in args.contender_names:
            contender = FACTORIES[name](ctx)
            for scenario in scenarios:  # a row off the contender's path is not measured and not shown
                if scenario.path not in contender.paths:
                    results.off_path.add((scenario.name, name))
            if not any(s.path in contender.paths for s in scenarios):
                continue  # nothing to measure it on (e.g. --kinds idle and an intercepting peer)
            if origin_reason and contender.paths == ("intercepted",):
                preflight.setdefault(name, origin_reason)
            if name in preflight:
                results.skipped[name] = preflight[name]
                continue
            try:
                started.append((contender, contender.start()))
            except ContenderUnavailable as exc:
                results.skipped[name] = str(exc)
                contender.stop()
            else:
                if (driver := contender.client()) is not None:
                    facts[f"{name} client"] = driver.facts
        for name, reason in results.skipped.items():
            _log(f"bench: {name} skipped: {reason}")

        def probe(contender: Contender, proxy: Address | None) -> Probe:
            assert upstream is not None and local is not None
            client = contender.client() or local.get()
            https = contender.target(origin.address) if origin is not None else None
            return Probe(contender, client, proxy, contender.target(upstream.bulk), contender.target(upstream.echo),
                         contender.target(upstream.idle), config, https=https,
                         trust=contender.https_trust())  # fmt: skip

        for contender, proxy in started:
            warm_up(probe(contender, proxy))
        fresh: dict[str, int] = {}
        for run in range(config.runs):
            _log(f"bench: round {run + 1} of {config.runs} ({time.monotonic() - began:.0f} s since the start)")
            for scenario in scenarios:
                if scenario.kind == "idle" and not fresh:
                    restarting = time.monotonic()
                    # the idle rows are raw: an intercepting-only peer (mitmproxy, squid-bump) keeps running
                    kept = [(c, p) for c, p in started if "raw" not in c.paths]
                    started = restart_all([(c, p) for c, p in started if "raw" in c.paths], results, run) + kept
                    fresh = {c.name: fresh_rss(c, probe(c, p)) for c, p in started if "raw" in c.paths}
                    _log(f"  contenders restarted for the idle scenarios ({time.monotonic() - restarting:.1f} s)")
                order = started[run % len(started) :] + started[: run % len(started)]
                for contender, proxy in order:
                    if scenario.path not in contender.paths:
                        continue
                    cell = replace(probe(contender, proxy), fresh_rss_kib=fresh.get(contender.name))
                    measure_cell(results, scenario, cell, run)
            fresh = {}
        if args.profile:
            target = next(((c, p) for c, p in started if c.name == args.profile), None)
            if target is None:
                profile = {"skipped": results.skipped.get(args.profile, "not started")}
            else:
                profile = profile_pass(target[0], probe(*target), scenarios, args.out, stamp)
    finally:
        for contender, _ in started:
            contender.stop()
            refused = getattr(contender, "refusals", None)
            if refused:
                refusals[contender.name] = dict(refused)
                run_notes.append(f"{contender.name}: its events name refused connections: {dict(refused)}")
            queries = getattr(contender, "dns_queries", 0)
            if queries:
                run_notes.append(f"{contender.name}: control sent {queries} DNS queries (refused)")
        if local is not None:
            local.close()
        if upstream is not None:
            upstream.stop()
        if origin is not None:
            origin.stop()
        if host is not None:
            host.close()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(copy, ignore_errors=True)

    micro_rows: list[micro.MicroRow] = []
    micro_skipped: dict[str, str] = {}
    if not args.no_micro:
        micro_rows, micro_skipped = micro.run_all(BENCH_DIR, args.quick, timeout=60 if args.quick else 180)

    add_derived(results)
    rows = build_rows(results)
    table = format_text(rows)
    if daemon_python:
        table = f"openshell daemons on: {interpreter.label(daemon_python)}\n\n{table}"
    notes = config_notes + run_notes + budget_notes(results, config) + [f"{k}: {v}" for k, v in micro_skipped.items()]
    micro_table = aligned(micro.micro_grid(micro_rows)) if micro_rows else ""
    standing = targets.standings(rows, micro_rows)
    command = "python3 bench/run.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    document = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command.strip(),
        "machine": machine_facts(),
        "peers": setup_peers.versions(),
        "product": product_facts | {"daemon_python": daemon_python},
        "clients": facts,
        "upstream": {"bulk": upstream.bulk, "echo": upstream.echo, "idle": upstream.idle} if upstream else None,
        "config": asdict(config) | {"nofile": nofile},
        "contenders": results.contenders,
        "skipped": results.skipped,
        "rows": rows_json(rows),
        "per_run": [
            {"scenario": s, "metric": m, "contender": c, "values": v} for (s, m, c), v in results.values.items()
        ],
        "failures": [{"scenario": s, "contender": c, "errors": e} for (s, c), e in results.failures.items()],
        "refusals": refusals,
        "connection_errors": [
            {"scenario": s, "contender": c, "count": n, "kinds": results.error_kinds.get((s, c), {})}
            for (s, c), n in results.errors.items()
        ],
        "micro": [r.as_dict() for r in micro_rows],
        "micro_skipped": micro_skipped,
        "targets": targets.standings_json(standing),
        "notes": notes,
        "profile": profile,
        "seconds": round(time.monotonic() - began, 1),
    }
    json_path = args.out / f"bench-{stamp}.json"
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    summary_md = format_summary_markdown(rows, results.contenders)
    micro_md = f"\n\n{markdown(micro.micro_grid(micro_rows))}" if micro_rows else ""
    daemons_md = f"openshell daemons on: `{interpreter.label(daemon_python)}`\n\n" if daemon_python else ""
    notes_md = "\n\n" + "\n".join(f"- {note}" for note in notes) if notes else ""
    targets_md = "\n\n" + markdown(targets.target_grid(standing))
    (args.out / f"bench-{stamp}.md").write_text(
        f"{daemons_md}{summary_md}{targets_md}\n\n{format_markdown(rows)}{micro_md}{notes_md}\n"
    )
    print(table)
    print("\nsummary\n" + format_summary(rows, results.contenders))
    if micro_table:
        print("\nmicro-benchmarks\n" + micro_table)
    print("\ntargets (docs/performance.md)\n" + aligned(targets.target_grid(standing)))
    for note in notes:
        print(f"note: {note}")
    print(f"\n{command.strip()} — {document['seconds']} s; results in {json_path}")
    return 0
