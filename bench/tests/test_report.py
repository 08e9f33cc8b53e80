"""From per-run values to rows and tables."""

from __future__ import annotations

from bench.report import (
    HEADER,
    Results,
    Row,
    add_derived,
    build_rows,
    format_markdown,
    format_summary,
    format_text,
    rows_json,
)
from bench.scenarios import Config, Outcome, Probe, Scenario, build


def _never(probe: Probe) -> Outcome:
    raise AssertionError("not measured in these tests")


CONFIG = Config(
    runs=2,
    bulk_bytes=1,
    sequential=1,
    concurrent=1,
    concurrency=64,
    idle_sizes=(1000,),
    setup_budget=1.0,
    idle_budget=1.0,
)
SCENARIOS = [Scenario(s.name, s.kind, s.metrics, _never) for s in build(CONFIG)]
CONTENDERS = ["direct", "openshell", "tinyproxy", "squid"]


def _results() -> Results:
    results = Results(2, list(CONTENDERS), SCENARIOS, skipped={"openshell": "not available yet"})
    for run, (direct, tiny, squid) in enumerate([(1000.0, 500.0, 250.0), (100.0, 40.0, 40.0)]):
        results.record("bulk up", "MB/s", "direct", run, direct)
        results.record("bulk up", "MB/s", "tinyproxy", run, tiny)
        results.record("bulk up", "MB/s", "squid", run, squid)
    for run, (direct, tiny) in enumerate([(0.2, 0.5), (0.3, 0.9)]):
        for metric in ("p50", "p99"):
            results.record("setup sequential", metric, "direct", run, direct)
            results.record("setup sequential", metric, "tinyproxy", run, tiny)
    results.failures[("setup sequential", "squid")] = ["run 1: TimeoutError: timed out"]
    return results


def _row(rows: list[Row], scenario: str, metric: str, contender: str) -> Row:
    return next(r for r in rows if (r.scenario, r.metric.key, r.contender) == (scenario, metric, contender))


def test_ratios_are_medians_of_per_run_ratios() -> None:
    rows = build_rows(_results())
    squid = _row(rows, "bulk up", "MB/s", "squid")
    assert squid.summary is not None and squid.summary.median == 145.0
    assert squid.ratios["direct"] is not None and squid.ratios["direct"].median == (0.25 + 0.4) / 2
    assert squid.ratios["tinyproxy"] is not None and squid.ratios["tinyproxy"].median == (0.5 + 1.0) / 2
    tiny = _row(rows, "bulk up", "MB/s", "tinyproxy")
    assert tiny.ratios["tinyproxy"] is None  # never against itself


def test_added_latency_is_per_run_difference_with_direct() -> None:
    results = _results()
    add_derived(results)
    assert results.series("setup sequential", "added p50", "tinyproxy") == [0.5 - 0.2, 0.9 - 0.3]
    assert results.series("setup sequential", "added p50", "squid") == [None, None]
    added = _row(build_rows(results), "setup sequential", "added p50", "tinyproxy")
    assert added.ratios == {"direct": None, "tinyproxy": None}  # a difference has no ratio


def test_skipped_contender_gets_one_row_per_scenario_with_its_reason() -> None:
    rows = build_rows(_results())
    skipped = [r for r in rows if r.contender == "openshell"]
    assert [r.scenario for r in skipped] == [s.name for s in SCENARIOS]
    assert all(r.summary is None and r.note == "skipped: not available yet" for r in skipped)
    text = format_text(rows)
    assert "skipped: not available yet" in text
    assert "skipped" in format_summary(rows, CONTENDERS).splitlines()[1]


def test_failed_cell_shows_its_failure_not_a_number() -> None:
    rows = build_rows(_results())
    failed = _row(rows, "setup sequential", "p50", "squid")
    assert failed.summary is None and failed.note == "failed: run 1: TimeoutError: timed out"


def test_tables_and_json_carry_every_row() -> None:
    rows = build_rows(_results())
    markdown = format_markdown(rows).splitlines()
    assert len(markdown) == len(rows) + 2
    assert markdown[1] == "|" + "---|" * len(HEADER)  # direct, tinyproxy, mitmproxy and squid-bump ratios
    assert all(line.startswith("| ") and line.endswith(" |") for line in markdown[:1] + markdown[2:])
    assert len(rows_json(rows)) == len(rows)
    assert rows_json(rows)[0]["contender"] == "direct"
