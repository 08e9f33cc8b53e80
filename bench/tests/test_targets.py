"""The target table: each row read from its own figure in the run and judged against its goal."""

from __future__ import annotations

import dataclasses

from bench.micro import MicroRow
from bench.report import Results, add_derived, build_rows
from bench.scenarios import Config, Outcome, Probe, build
from bench.targets import TARGETS, standings, standings_json, target_grid


def _never(probe: Probe) -> Outcome:
    raise AssertionError("not measured in these tests")


CONFIG = Config(runs=2, bulk_bytes=1, sequential=1, concurrent=1, concurrency=64, idle_sizes=(1000,),
                setup_budget=1.0, idle_budget=1.0)  # fmt: skip
SCENARIOS = [dataclasses.replace(s, measure=_never) for s in build(CONFIG)]
CONTENDERS = ["direct", "openshell", "openshell-proxy-pod", "tinyproxy", "mitmproxy", "squid-bump"]


def _results() -> Results:
    results = Results(2, list(CONTENDERS), SCENARIOS, skipped={"squid-bump": "squid has no ssl_crtd here"})
    for run in range(2):
        # bulk up: 1.2× and 1.25× tinyproxy (met); bulk down 0.5× (not met)
        for contender, up, down in (("openshell", 600.0 + run * 25, 250.0), ("tinyproxy", 500.0, 500.0),
                                    ("openshell-proxy-pod", 1000.0, 1000.0), ("direct", 2000.0, 2000.0)):  # fmt: skip
            results.record("bulk up", "MB/s", contender, run, up)
            results.record("bulk down", "MB/s", contender, run, down)
        # setup sequential: added p50 0.8 ms (met), added p99 3.5 ms (not met)
        for contender, p50, p99 in (("direct", 0.2, 0.5), ("openshell", 1.0, 4.0), ("tinyproxy", 0.3, 0.6)):
            results.record("setup sequential", "p50", contender, run, p50)
            results.record("setup sequential", "p99", contender, run, p99)
        for contender, rate in (("openshell", 600.0), ("tinyproxy", 3000.0)):  # 0.2× tinyproxy: not met
            results.record("setup 64-way", "conns/s", contender, run, rate)
        for contender, rate in (("openshell", 160.0), ("mitmproxy", 100.0)):  # 1.6× mitmproxy: met
            results.record("intercepted setup", "conns/s", contender, run, rate)
        for contender, kib in (("openshell", 31.0), ("tinyproxy", 20.0)):  # 1.55× tinyproxy, lower is better
            results.record("idle 1000", "per conn", contender, run, kib)
    add_derived(results)
    return results


MICRO = [
    MicroRow("bench_l7.py", "l7 intercepted/tunnel ratio: download MB/s (16 MiB, 1 connection)", "ratio", 0.27, {}),
    MicroRow("bench_l7.py", "l7 intercepted/tunnel ratio: keep-alive GET requests/s, 4 connections", "ratio", 0.65, {}),
    MicroRow("bench_l7.py", "l7 terminated/tunnel ratio: keep-alive GET requests/s, 1 connection", "ratio", 0.9, {}),
]


def _status() -> dict[str, str]:
    return {s.target.label: s.status for s in standings(build_rows(_results()), MICRO)}


def test_each_target_is_judged_on_its_own_figure() -> None:
    status = _status()
    assert status["raw bulk up ÷ tinyproxy"] == "met"
    assert status["raw bulk down ÷ tinyproxy"] == "not met"
    assert status["raw setup sequential, added p50"] == "met"
    assert status["raw setup sequential, added p99"] == "not met"
    assert status["raw setup N-way ÷ tinyproxy"] == "not met"
    assert status["intercepted setup ÷ mitmproxy"] == "met"
    assert status["idle per connection ÷ tinyproxy"] == "not met"  # lower is better: 1.55× misses ≤ 1.0×
    assert status["inspected ÷ tunnel, download (bench_l7)"] == "not met"
    assert status["inspected ÷ tunnel, keep-alive GET, N connections (bench_l7)"] == "met"


def test_a_missing_figure_says_why_and_is_never_met() -> None:
    status = _status()
    assert status["intercepted setup ÷ squid-bump"] == "not measured: no squid-bump figure in this run"
    # the terminated mode's row is no stand-in for the inspected one
    assert status["inspected ÷ tunnel, keep-alive GET, 1 connection (bench_l7)"] == (
        "not measured: the micro-benchmark row is not in this run"
    )


def test_the_judged_figure_is_the_median_per_run_ratio_and_proxy_pod_is_shown_beside_it() -> None:
    by_label = {s.target.label: s for s in standings(build_rows(_results()), MICRO)}
    up = by_label["raw bulk up ÷ tinyproxy"]
    assert up.value is not None and (up.value.low, up.value.high) == (1.2, 1.25)
    assert up.compared is not None and up.compared.median == 2.0
    grid = target_grid(list(by_label.values()))
    assert grid[0] == ["target", "goal", "openshell", "status", "openshell-proxy-pod"]
    up_line = next(line for line in grid if line[0] == "raw bulk up ÷ tinyproxy")
    assert up_line[1:] == ["≥ 1.00×", "1.23× (1.20–1.25)", "met", "2.00× (2.00–2.00)"]
    added = next(line for line in grid if line[0] == "raw setup sequential, added p99")
    assert added[1:4] == ["≤ 3.00 ms", "3.50 ms (3.50–3.50)", "not met"]
    assert len(standings_json(list(by_label.values()))) == len(TARGETS)


def test_control_on_every_core_gets_its_own_column_when_it_ran() -> None:
    results = _results()
    assert "openshell-workers" not in target_grid(standings(build_rows(results), MICRO))[0]
    with_workers = Results(2, [*CONTENDERS, "openshell-workers"], SCENARIOS)
    for run in range(2):
        for contender, rate in (("openshell", 600.0), ("openshell-workers", 1050.0 + run * 100), ("tinyproxy", 3000.0)):
            with_workers.record("setup 64-way", "conns/s", contender, run, rate)
    add_derived(with_workers)
    standing = standings(build_rows(with_workers), MICRO)
    grid = target_grid(standing)
    assert grid[0][-1] == "openshell-workers"
    (row,) = [r for r in grid if r[0] == "raw setup N-way ÷ tinyproxy"]
    assert row[2].startswith("0.200×") and row[3] == "not met"  # still judged on openshell: one process
    assert row[-1].startswith("0.367×")  # the median of 0.35× and 0.383×, shown beside it
    (judged,) = [s for s in standing if s.target.label == "raw setup N-way ÷ tinyproxy"]
    assert standings_json([judged])[0]["openshell-workers"] is not None
