"""Where the product stands against its performance targets, row by row (pure).

The targets are the ones docs/performance.md "Where each target stands" lists. Each is read from the run it is
printed with — a ratio against a peer measured in the same run, an added latency over the direct connection in
the same run, or a micro-benchmark's own same-run ratio (bench/bench_l7.py) — and judged against its goal:
``met``, ``not met``, or ``not measured`` with the reason (a peer skipped, a row left out by ``--quick``).

Rules:
1. A target is judged on the median of its per-run values (``bench.stats``), the spread shown beside it.
2. Only the boundary topology (contender ``openshell``) is judged; the proxy-pod topology's figure is shown
   beside it for comparison, since it is the same product without the link, and so is ``openshell-workers``'s
   (control on every core, as rendered pods run it) when it ran.
3. Nothing is judged on a missing number: a row without its measurement says why, never "met".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bench.micro import MicroRow
from bench.report import Row, fmt
from bench.stats import Summary

JUDGED = "openshell"
COMPARED = "openshell-proxy-pod"
WORKERS = "openshell-workers"  # opt-in: control with --workers=auto, as rendered pods run it


@dataclass(frozen=True)
class Target:
    """One target row: what it reads and the goal it is held to."""

    label: str
    goal: float
    higher_is_better: bool
    unit: str  # "×" for a ratio, "ms" for an added latency
    scenario: str = ""  # a main row: the scenario (a regular expression, matched whole) …
    metric: str = ""  # … its metric …
    reference: str = ""  # … and the peer the ratio is against ("" for the value itself)
    micro: str = ""  # or a micro-benchmark row: its name (a regular expression, matched whole)

    def goal_text(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        return f"{sign} {fmt(self.goal)}{'×' if self.unit == '×' else ' ' + self.unit}"


TARGETS: tuple[Target, ...] = (
    Target("inspected ÷ tunnel, download (bench_l7)", 0.6, True, "×",
           micro=r"l7 intercepted/tunnel ratio: download MB/s .*"),
    Target("inspected ÷ tunnel, keep-alive GET, 1 connection (bench_l7)", 0.6, True, "×",
           micro=r"l7 intercepted/tunnel ratio: keep-alive GET requests/s, 1 connection"),
    Target("inspected ÷ tunnel, keep-alive GET, N connections (bench_l7)", 0.6, True, "×",
           micro=r"l7 intercepted/tunnel ratio: keep-alive GET requests/s, \d+ connections"),
    Target("intercepted setup ÷ mitmproxy", 1.5, True, "×",
           scenario="intercepted setup", metric="conns/s", reference="mitmproxy"),
    Target("intercepted setup ÷ squid-bump", 1.5, True, "×",
           scenario="intercepted setup", metric="conns/s", reference="squid-bump"),
    Target("raw setup N-way ÷ tinyproxy", 0.3, True, "×",
           scenario=r"setup \d+-way", metric="conns/s", reference="tinyproxy"),
    Target("raw setup sequential, added p50", 1.0, False, "ms", scenario="setup sequential", metric="added p50"),
    Target("raw setup sequential, added p99", 3.0, False, "ms", scenario="setup sequential", metric="added p99"),
    Target("raw bulk up ÷ tinyproxy", 1.0, True, "×", scenario="bulk up", metric="MB/s", reference="tinyproxy"),
    Target("raw bulk down ÷ tinyproxy", 1.0, True, "×", scenario="bulk down", metric="MB/s",
           reference="tinyproxy"),
    Target("idle per connection ÷ tinyproxy", 1.0, False, "×", scenario=r"idle \d+", metric="per conn",
           reference="tinyproxy"),
)  # fmt: skip


@dataclass(frozen=True)
class Standing:
    target: Target
    value: Summary | None  # the judged contender's figure
    compared: Summary | None  # the proxy-pod topology's, when it ran
    status: str  # "met", "not met" or "not measured: <why>"
    workers: Summary | None = None  # openshell-workers', when it ran


def _main_figure(target: Target, rows: Sequence[Row], contender: str) -> tuple[Summary | None, str]:
    pattern = re.compile(target.scenario)
    candidates = [r for r in rows if r.contender == contender and pattern.fullmatch(r.scenario)]
    if not candidates:
        return None, f"no {contender} row for {target.scenario!r} in this run"
    # several idle sizes match: the first (the smallest) is the one every run, quick included, has
    row = next((r for r in candidates if r.metric.key == target.metric), None)
    if row is None:
        return None, candidates[0].note or f"no {target.metric} for {candidates[0].scenario}"
    if row.summary is None:
        return None, row.note
    if not target.reference:
        return row.summary, ""
    ratio = row.ratios.get(target.reference)
    if ratio is None:
        return None, f"no {target.reference} figure in this run"
    return ratio, ""


def _micro_figure(target: Target, micro_rows: Sequence[MicroRow]) -> tuple[Summary | None, str]:
    pattern = re.compile(target.micro)
    row = next((r for r in micro_rows if pattern.fullmatch(r.name)), None)
    if row is None:
        return None, "the micro-benchmark row is not in this run"
    return Summary(row.value, row.value, row.value, 1), ""


def standings(rows: Sequence[Row], micro_rows: Sequence[MicroRow]) -> list[Standing]:
    out: list[Standing] = []
    for target in TARGETS:
        if target.micro:
            value, why = _micro_figure(target, micro_rows)
            compared = None
        else:
            value, why = _main_figure(target, rows, JUDGED)
            compared, _ = _main_figure(target, rows, COMPARED)
            workers, _ = _main_figure(target, rows, WORKERS)
        if value is None:
            status = f"not measured: {why}"
        else:
            met = value.median >= target.goal if target.higher_is_better else value.median <= target.goal
            status = "met" if met else "not met"
        out.append(Standing(target, value, compared, status, workers if not target.micro else None))
    return out


def _figure(target: Target, value: Summary | None) -> str:
    if value is None:
        return "—"
    suffix = "×" if target.unit == "×" else f" {target.unit}"
    spread = f" ({fmt(value.low)}–{fmt(value.high)})" if value.n > 1 else ""
    return f"{fmt(value.median)}{suffix}{spread}"


TARGET_HEADER = ["target", "goal", JUDGED, "status", COMPARED]


def target_grid(standing: Sequence[Standing]) -> list[list[str]]:
    """The table; with a column for ``openshell-workers`` when any row has its figure."""
    with_workers = any(s.workers is not None for s in standing)
    header = [*TARGET_HEADER, WORKERS] if with_workers else TARGET_HEADER
    return [header] + [
        [s.target.label, s.target.goal_text(), _figure(s.target, s.value), s.status, _figure(s.target, s.compared),
         *([_figure(s.target, s.workers)] if with_workers else [])]
        for s in standing
    ]  # fmt: skip


def standings_json(standing: Sequence[Standing]) -> list[dict[str, object]]:
    return [
        {
            "target": s.target.label,
            "goal": s.target.goal,
            "higher_is_better": s.target.higher_is_better,
            "unit": s.target.unit,
            "value": s.value.as_dict() if s.value else None,
            COMPARED: s.compared.as_dict() if s.compared else None,
            WORKERS: s.workers.as_dict() if s.workers else None,
            "status": s.status,
        }
        for s in standing
    ]
