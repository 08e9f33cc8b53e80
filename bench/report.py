"""From per-run measurements to rows, a printed table, a Markdown table and a JSON document (pure).

Rules:
1. One row per (scenario, metric, contender), in the order the scenarios and contenders were given.
2. A skipped contender still gets a row per scenario, with the reason instead of a number.
3. Ratios are per-run ratios summarised (see ``bench.stats``), against direct and against tinyproxy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.scenarios import INTERCEPT_REFERENCES, SETUP_DERIVED, Metric, Scenario
from bench.stats import Summary, per_run_ratios, summarize

REFERENCES = ("direct", "tinyproxy")
# Every ratio column: the intercepting peers' are filled on the rows that name them (Scenario.references).
RATIO_COLUMNS = REFERENCES + INTERCEPT_REFERENCES

Key = tuple[str, str, str]  # scenario, metric, contender


@dataclass
class Results:
    runs: int
    contenders: list[str]
    scenarios: list[Scenario]
    skipped: dict[str, str] = field(default_factory=dict)
    values: dict[Key, list[float | None]] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)  # failed connections
    error_kinds: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)  # ... and what they hit
    failures: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # failed cells
    # (scenario, contender) pairs never measured because the row is not on the contender's path (Contender.paths):
    # no row at all, not an "n/a"
    off_path: set[tuple[str, str]] = field(default_factory=set)

    def record(self, scenario: str, metric: str, contender: str, run: int, value: float | None) -> None:
        self.values.setdefault((scenario, metric, contender), [None] * self.runs)[run] = value

    def series(self, scenario: str, metric: str, contender: str) -> list[float | None]:
        return self.values.get((scenario, metric, contender), [None] * self.runs)


def metrics_of(scenario: Scenario) -> tuple[Metric, ...]:
    return scenario.metrics + (SETUP_DERIVED if scenario.kind == "setup" else ())


def add_derived(results: Results) -> None:
    """Added latency over direct, per run: contender p50/p99 minus direct's in the same run."""
    for scenario in results.scenarios:
        if scenario.kind != "setup":
            continue
        for base in ("p50", "p99"):
            direct = results.series(scenario.name, base, "direct")
            for contender in results.contenders:
                own = results.series(scenario.name, base, contender)
                for run, (v, d) in enumerate(zip(own, direct, strict=True)):
                    value = v - d if v is not None and d is not None else None
                    results.record(scenario.name, f"added {base}", contender, run, value)


@dataclass(frozen=True)
class Row:
    scenario: str
    metric: Metric
    contender: str
    summary: Summary | None
    ratios: dict[str, Summary | None]
    errors: int
    note: str  # why there is no number: "skipped: …", "failed: …" or "n/a"


def build_rows(results: Results) -> list[Row]:
    rows: list[Row] = []
    for scenario in results.scenarios:
        for index, metric in enumerate(metrics_of(scenario)):
            for contender in results.contenders:
                if (scenario.name, contender) in results.off_path:
                    continue
                if contender in results.skipped and index > 0:
                    continue  # a skipped contender's reason is given once per scenario
                series = results.series(scenario.name, metric.key, contender)
                ratios: dict[str, Summary | None] = {}
                for ref in REFERENCES + scenario.references:
                    reference = results.series(scenario.name, metric.key, ref)
                    usable = metric.ratio and ref != contender and ref in results.contenders
                    ratios[ref] = summarize(per_run_ratios(series, reference)) if usable else None
                summary = summarize(series)
                rows.append(
                    Row(
                        scenario.name,
                        metric,
                        contender,
                        summary,
                        ratios,
                        results.errors.get((scenario.name, contender), 0),
                        "" if summary else _why_missing(results, scenario.name, contender),
                    )
                )
    return rows


def _why_missing(results: Results, scenario: str, contender: str) -> str:
    if contender in results.skipped:
        return f"skipped: {results.skipped[contender]}"
    failures = results.failures.get((scenario, contender))
    return f"failed: {failures[0]}" if failures else "n/a"


def label(metric: Metric) -> str:
    return metric.key if metric.key == metric.unit else f"{metric.key} ({metric.unit})"


def fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


HEADER = ["scenario", "metric", "contender", "median", "spread (min–max)", "runs",
          *(f"× {ref}" for ref in RATIO_COLUMNS), "failed"]  # fmt: skip


def _cells(row: Row) -> list[str]:
    errors = str(row.errors) if row.errors else ""
    if row.summary is None:
        return [row.scenario, label(row.metric), row.contender, row.note, "", "", *([""] * len(RATIO_COLUMNS)), errors]
    s = row.summary
    ratio_cells = [
        f"{fmt(r.median)}× ({fmt(r.low)}–{fmt(r.high)})" if (r := row.ratios.get(ref)) else "—" for ref in RATIO_COLUMNS
    ]
    return [
        row.scenario,
        label(row.metric),
        row.contender,
        fmt(s.median),
        f"{fmt(s.low)}–{fmt(s.high)}",
        str(s.n),
        *ratio_cells,
        errors,
    ]


def format_text(rows: Sequence[Row]) -> str:
    """An aligned table; a missing number's reason runs across the empty columns beside it."""
    table = [(HEADER, True)] + [(_cells(r), r.summary is not None) for r in rows]
    widths = [max(len(cells[i]) for cells, measured in table if measured or i != 3) for i in range(len(HEADER))]
    out: list[str] = []
    previous = ""
    for cells, _ in table:
        if cells[0] != previous and out:
            out.append("")
        previous = cells[0]
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip())
    return "\n".join(out)


def summary_grid(rows: Sequence[Row], contenders: Sequence[str]) -> list[list[str]]:
    """One line per headline metric, one column per contender: ``median (×direct, ×tinyproxy)``."""
    grid = [["scenario", "metric", *contenders]]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    skipped: dict[tuple[str, str], str] = {}
    for row in rows:
        if row.summary is None and row.note.startswith("skipped"):
            skipped[(row.scenario, row.contender)] = "skipped"
            continue
        if not row.metric.headline:
            continue
        line = cells.setdefault((row.scenario, label(row.metric)), {})
        if row.summary is None:
            line[row.contender] = "n/a" if row.note == "n/a" else "failed"
            continue
        ratios = [
            f"{fmt(r.median)}×{tag}"
            for ref, tag in zip(RATIO_COLUMNS, ("d", "t", "m", "s"), strict=True)
            if (r := row.ratios.get(ref))
        ]
        line[row.contender] = fmt(row.summary.median) + (f" ({', '.join(ratios)})" if ratios else "")
    for (scenario, metric), by_contender in cells.items():
        grid.append([scenario, metric, *(by_contender.get(c) or skipped.get((scenario, c), "") for c in contenders)])
    return grid


def aligned(grid: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in grid) for i in range(len(grid[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(line)).rstrip() for line in grid)


def markdown(grid: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(grid[0]) + " |", "|" + "---|" * len(grid[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in grid[1:]]
    return "\n".join(lines)


SUMMARY_LEGEND = (
    "median over runs; (×d, ×t) = median per-run ratio against direct and against tinyproxy; on the intercepted "
    "rows (×m, ×s) = against mitmproxy and squid with SSL bump"
)


def format_summary(rows: Sequence[Row], contenders: Sequence[str]) -> str:
    return aligned(summary_grid(rows, contenders)) + "\n" + SUMMARY_LEGEND


def format_summary_markdown(rows: Sequence[Row], contenders: Sequence[str]) -> str:
    return markdown(summary_grid(rows, contenders)) + "\n\n" + SUMMARY_LEGEND


def format_markdown(rows: Sequence[Row]) -> str:
    return markdown([HEADER] + [_cells(r) for r in rows])


def rows_json(rows: Sequence[Row]) -> list[dict[str, object]]:
    return [
        {
            "scenario": r.scenario,
            "metric": r.metric.key,
            "unit": r.metric.unit,
            "higher_is_better": r.metric.higher_is_better,
            "contender": r.contender,
            "summary": r.summary.as_dict() if r.summary else None,
            "ratio": {ref: (s.as_dict() if s else None) for ref, s in r.ratios.items()},
            "failed_connections": r.errors,
            "note": r.note,
        }
        for r in rows
    ]
