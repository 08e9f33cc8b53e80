"""The scenarios: what one measurement of one contender in one run does, and which numbers it yields.

Every scenario is a row of :func:`build` — a name, its metrics (unit, whether a ratio is meaningful)
and a ``measure`` function taking a :class:`Probe`. ``measure`` returns the metric values of that run
and the number of failed connections; an exception fails the cell for that run only.

Derived metrics ("added p50/p99 over direct") are not measured here: they need direct's number from
the same run and are computed when the run is complete (see ``bench.report``).

Idle scenarios measure memory, which allocators keep after connections close: the harness therefore
restarts every contender before them in each round, and the per-connection cost is the peak over the
RSS of that fresh process (after a few warm-up connections), whatever ran before in the round. For the
sandbox, control's and the boundary daemon's own peaks are reported too (the targets are per daemon).

The client is always a driver (``bench.remote``): the same program wherever it runs, so a measurement is
the same calls whatever the contender.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import clients, procstat
from bench.contenders import Address, Contender
from bench.remote import ClientDriver
from bench.stats import percentile
from bench.wire import Direction

MIB = 1024 * 1024


@dataclass(frozen=True)
class Config:
    runs: int
    bulk_bytes: int
    sequential: int  # connections per sequential-setup measurement
    concurrent: int  # connections per concurrent-setup measurement
    concurrency: int
    idle_sizes: tuple[int, ...]
    setup_budget: float  # seconds one setup measurement may take (it stops early past that)
    idle_budget: float  # seconds allowed for opening the idle connections
    idle_hold: float = 1.0  # seconds the idle connections are held before the peak is read
    idle_open_concurrency: int = 256
    timeout: float = 60.0  # per socket operation (bulk) or per connection (setup, idle)
    https_sequential: int = 300  # HTTPS exchanges per intercepted-setup measurement
    https_bulk_bytes: int = 0  # the intercepted download's size; 0 leaves that row out (--quick)


@dataclass(frozen=True)
class Probe:
    contender: Contender
    client: ClientDriver  # where the client runs: the harness's driver, or the sandbox's agent
    proxy: Address | None
    bulk: Address  # the upstream listeners, as the contender wants them named in CONNECT
    echo: Address  # one echo, then the upstream closes (setup)
    idle: Address  # one echo, then held (idle)
    config: Config
    fresh_rss_kib: int | None = None  # the contender's RSS right after its restart for the idle scenarios
    https: Address | None = None  # the HTTPS origin, as the contender wants it named in CONNECT (intercepted rows)
    trust: str | None = None  # the CA file the client verifies through this contender (None: its environment's)


@dataclass(frozen=True)
class Metric:
    key: str
    unit: str
    ratio: bool = True  # False where a ratio means nothing (a difference, a count)
    higher_is_better: bool = False
    headline: bool = True  # shown in the one-screen summary as well as in the full table


@dataclass(frozen=True)
class Outcome:
    values: dict[str, float | None]
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)  # what the failed connections failed with


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "bulk", "setup" or "idle": what the row means, for readers of the JSON
    metrics: tuple[Metric, ...]
    measure: Callable[[Probe], Outcome]
    path: str = "raw"  # "raw" (CONNECT tunnel rows) or "intercepted" (HTTPS to the origin): Contender.paths
    references: tuple[str, ...] = ()  # contenders this row is also given ratios against (beyond direct, tinyproxy)


THROUGHPUT = (Metric("MB/s", "MB/s", higher_is_better=True),)
SETUP = (
    Metric("conns/s", "conns/s", higher_is_better=True),
    Metric("p50", "ms", headline=False),
    Metric("p99", "ms", headline=False),
    # connections completed: fewer than asked when the time budget ended the batch (harness.budget_notes says so)
    Metric("conns", "conns", ratio=False, higher_is_better=True, headline=False),
    # CPU time of all the contender's processes per connection made: what a connection costs the proxy,
    # whatever else the shared machine runs meanwhile (wall-clock latency also counts waiting for a CPU)
    Metric("CPU/conn", "ms", headline=False),
)
# Where a sequential setup's latency goes, step by step (``clients.STEPS``): the medians, for the profile to explain.
SETUP_STEPS = tuple(Metric(f"{step} p50", "ms", ratio=False, headline=False) for step in clients.STEPS)
SETUP_DERIVED = (Metric("added p50", "ms", ratio=False), Metric("added p99", "ms", ratio=False))
IDLE = (
    Metric("peak RSS", "MiB"),
    Metric("per conn", "KiB"),
    Metric("opened/s", "conns/s", higher_is_better=True, headline=False),
    Metric("held", "conns", ratio=False, higher_is_better=True),
    Metric("control peak", "MiB", ratio=False),  # the sandbox only: each daemon's own peak RSS
    Metric("boundary peak", "MiB", ratio=False),
)
DAEMONS = ("control", "boundary")
# The intercepted rows: HTTPS through each contender's interception, as ratios against these peers.
INTERCEPT_REFERENCES = ("mitmproxy", "squid-bump")


def _bulk(direction: Direction) -> Callable[[Probe], Outcome]:
    def measure(probe: Probe) -> Outcome:
        result = probe.client.bulk(probe.proxy, probe.bulk, direction, probe.config.bulk_bytes, probe.config.timeout)
        return Outcome({"MB/s": result.mb_per_s})

    return measure


def _setup_outcome(result: clients.SetupResult, cpu_s: float | None = None) -> Outcome:
    if not result.latencies:
        values: dict[str, float | None] = {"conns/s": None, "p50": None, "p99": None, "conns": 0.0, "CPU/conn": None}
        return Outcome(values, result.errors, result.error_kinds)
    return Outcome(
        {
            "conns": float(len(result.latencies)),  # fewer than asked when the budget ran out
            "conns/s": result.conns_per_s,
            "p50": percentile(result.latencies, 50) * 1e3,
            "p99": percentile(result.latencies, 99) * 1e3,
            "CPU/conn": cpu_s / len(result.latencies) * 1e3 if cpu_s is not None else None,
            **{f"{step} p50": percentile(seconds, 50) * 1e3 for step, seconds in result.steps.items() if seconds},
        },
        result.errors,
        result.error_kinds,
    )


def _contender_pids(probe: Probe) -> list[int]:
    return [pid for group in probe.contender.pid_groups().values() for pid in group]


def _cpu_during(probe: Probe, run: Callable[[], clients.SetupResult]) -> Outcome:
    """``run()``'s outcome with the CPU time the contender's processes used meanwhile (none for direct)."""
    pids = _contender_pids(probe)
    before = procstat.cpu_seconds(pids)
    result = run()
    return _setup_outcome(result, procstat.cpu_seconds(pids) - before if pids else None)


def measure_sequential(probe: Probe) -> Outcome:
    cfg = probe.config
    return _cpu_during(
        probe,
        lambda: probe.client.setup_sequential(probe.proxy, probe.echo, cfg.sequential, cfg.timeout, cfg.setup_budget),
    )


def measure_concurrent(probe: Probe) -> Outcome:
    cfg = probe.config
    return _cpu_during(
        probe,
        lambda: probe.client.setup_concurrent(
            probe.proxy, probe.echo, cfg.concurrent, cfg.concurrency, cfg.timeout, cfg.setup_budget
        ),
    )


def measure_https_setup(probe: Probe) -> Outcome:
    """Sequential HTTPS exchanges (connect, CONNECT, TLS handshake, one GET): handshakes/s and their latency."""
    cfg = probe.config
    if probe.https is None:
        raise RuntimeError("the harness has no HTTPS origin")
    https = probe.https
    return _cpu_during(
        probe,
        lambda: probe.client.https_setup_sequential(
            probe.proxy, https, probe.trust, cfg.https_sequential, cfg.timeout, cfg.setup_budget
        ),
    )


def measure_https_download(probe: Probe) -> Outcome:
    if probe.https is None:
        raise RuntimeError("the harness has no HTTPS origin")
    result = probe.client.https_download(probe.proxy, probe.https, probe.trust, probe.config.https_bulk_bytes,
                                         probe.config.timeout)  # fmt: skip
    return Outcome({"MB/s": result.mb_per_s})


def intercepted(config: Config) -> list[Scenario]:
    """The intercepted rows: setup always (``--quick``'s one row), the download only in the full bench."""
    rows = [Scenario("intercepted setup", "setup", SETUP, measure_https_setup, "intercepted", INTERCEPT_REFERENCES)]
    if config.https_bulk_bytes:
        rows.append(Scenario("intercepted bulk down", "bulk", THROUGHPUT, measure_https_download, "intercepted",
                             INTERCEPT_REFERENCES))  # fmt: skip
    return rows


def _wait_fds_below(pids: list[int], limit: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while procstat.open_fds(pids) > limit and time.monotonic() < deadline:
        time.sleep(0.1)


def _idle(count: int) -> Callable[[Probe], Outcome]:
    def measure(probe: Probe) -> Outcome:
        cfg = probe.config
        groups = probe.contender.pid_groups()
        pids = [pid for group in groups.values() for pid in group]
        baseline_kib = probe.fresh_rss_kib if probe.fresh_rss_kib is not None else procstat.memory(pids).rss_kib
        baseline_fds = procstat.open_fds(pids)
        exact_peak = procstat.reset_peak(pids)
        hold = probe.client.open_idle(
            probe.proxy, probe.idle, count, cfg.idle_open_concurrency, cfg.timeout, cfg.idle_budget
        )
        opened = hold.opened
        daemons: dict[str, float | None] = {f"{name} peak": None for name in DAEMONS}
        try:
            sampled = procstat.memory(pids).rss_kib
            deadline = time.monotonic() + cfg.idle_hold
            while time.monotonic() < deadline:
                time.sleep(0.1)
                sampled = max(sampled, procstat.memory(pids).rss_kib)
            peak_kib = procstat.memory(pids).hwm_kib if exact_peak else sampled
            for name in DAEMONS:
                if groups.get(name) and exact_peak:
                    daemons[f"{name} peak"] = procstat.memory(groups[name]).hwm_kib / 1024
        finally:
            hold.close()
        _wait_fds_below(pids, baseline_fds + 16, timeout=30.0)
        values: dict[str, float | None] = {
            "peak RSS": peak_kib / 1024 if pids else None,
            "per conn": (peak_kib - baseline_kib) / opened if pids and opened else None,
            "opened/s": opened / hold.seconds if hold.seconds else None,
            "held": float(opened),
            **daemons,
        }
        return Outcome(values, hold.errors, hold.error_kinds)

    return measure


def build(config: Config) -> list[Scenario]:
    scenarios = [
        Scenario("bulk up", "bulk", THROUGHPUT, _bulk(Direction.UP)),
        Scenario("bulk down", "bulk", THROUGHPUT, _bulk(Direction.DOWN)),
        Scenario("setup sequential", "setup", SETUP + SETUP_STEPS, measure_sequential),
        Scenario(f"setup {config.concurrency}-way", "setup", SETUP, measure_concurrent),
        *intercepted(config),
    ]
    scenarios += [Scenario(f"idle {n}", "idle", IDLE, _idle(n)) for n in config.idle_sizes]
    return scenarios


def idle_sizes(wanted: tuple[int, ...], nofile: int) -> tuple[tuple[int, ...], list[str]]:
    """Cap idle sizes so a proxy holding two descriptors per connection stays under ``nofile``."""
    cap = (nofile - 256) // 2
    sizes: list[int] = []
    notes: list[str] = []
    for n in wanted:
        if n > cap:
            notes.append(f"idle {n:,} capped to {cap:,}: a proxy needs 2 fds per connection, nofile is {nofile}")
            n = cap
        if n > 0 and n not in sizes:
            sizes.append(n)
    return tuple(sizes), notes
