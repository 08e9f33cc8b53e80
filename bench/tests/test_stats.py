"""Percentiles, summaries and per-run ratios."""

from __future__ import annotations

import pytest

from bench.stats import Summary, per_run_ratios, percentile, summarize


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),
        (list(map(float, range(1, 101))), 99, 99.01),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_rejects(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_summarize_skips_missing_values_and_never_invents_zeros() -> None:
    assert summarize([None, 3.0, 1.0, None, 2.0]) == Summary(2.0, 1.0, 3.0, 3)
    assert summarize([None, None]) is None
    assert summarize([]) is None


def test_ratios_are_taken_within_a_run() -> None:
    # A slow second run slows both: the per-run ratio stays 0.5, the ratio of medians would not.
    values: list[float | None] = [50.0, 10.0, 60.0]
    reference: list[float | None] = [100.0, 20.0, 120.0]
    assert per_run_ratios(values, reference) == [0.5, 0.5, 0.5]


def test_ratio_missing_where_either_side_is_missing_or_zero() -> None:
    assert per_run_ratios([1.0, None, 3.0, 4.0], [2.0, 2.0, None, 0.0]) == [0.5, None, None, None]


def test_ratio_runs_must_align() -> None:
    with pytest.raises(ValueError):
        per_run_ratios([1.0], [1.0, 2.0])
